package provision

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestStreamIsIdempotent(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	for i := range 2 {
		if _, err := Stream(t.Context(), js, ResultStreamConfig(Options{})); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if _, err := Stream(t.Context(), js, CallStreamConfig("geo", Options{})); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if _, err := Stream(t.Context(), js, TimerStreamConfig(Options{})); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		if _, err := KeyValue(t.Context(), js, TurnBucketConfig(Options{})); err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
	}
}

func TestIncompatibleStreamIsReportedNotReplaced(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	theirs := jetstream.StreamConfig{Name: protocol.ResultStream, Subjects: []string{"fnresult.>"}, Retention: jetstream.InterestPolicy}
	if _, err := js.CreateStream(t.Context(), theirs); err != nil {
		t.Fatal(err)
	}
	_, err := Stream(t.Context(), js, ResultStreamConfig(Options{}))
	var inc *IncompatibleError
	if !errors.As(err, &inc) {
		t.Fatalf("err = %v, want IncompatibleError", err)
	}
	if !strings.Contains(err.Error(), "retention") || !strings.Contains(err.Error(), "max_msgs_per_subject") {
		t.Errorf("error does not name the differences: %v", err)
	}
	s, err := js.Stream(t.Context(), protocol.ResultStream)
	if err != nil {
		t.Fatal(err)
	}
	if s.CachedInfo().Config.Retention != jetstream.InterestPolicy {
		t.Error("existing stream was changed")
	}
}

func TestIncompatibleBucketIsReported(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: protocol.TurnBucket, History: 10}); err != nil {
		t.Fatal(err)
	}
	_, err := KeyValue(t.Context(), js, TurnBucketConfig(Options{}))
	var inc *IncompatibleError
	if !errors.As(err, &inc) || !strings.Contains(err.Error(), "history") {
		t.Fatalf("err = %v, want IncompatibleError about history", err)
	}
}

func TestConsumerChecksFilterAndUpdatesLimits(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	s, err := Stream(t.Context(), js, CallStreamConfig("geo", Options{}))
	if err != nil {
		t.Fatal(err)
	}
	cfg := jetstream.ConsumerConfig{Durable: "get_weather", FilterSubject: "fncall.geo.get_weather", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 5}
	if _, err := Consumer(t.Context(), s, cfg); err != nil {
		t.Fatal(err)
	}
	cfg.MaxAckPending = 7
	c, err := Consumer(t.Context(), s, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxAckPending; got != 7 {
		t.Errorf("MaxAckPending = %d, want 7", got)
	}
	cfg.FilterSubject = "fncall.geo.other"
	var inc *IncompatibleError
	if _, err := Consumer(t.Context(), s, cfg); !errors.As(err, &inc) {
		t.Errorf("err = %v, want IncompatibleError", err)
	}
}
