package provision

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestStreamIsIdempotent(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	for i := range 2 {
		if _, err := Stream(t.Context(), js, ResultStreamConfig("geo", 0, Options{})); err != nil {
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

// A call stream created before the 2-minute window, with 15 minutes, is
// used as it is; one with a window shorter than this version asks for is
// refused, naming it.
func TestCallStreamWindows(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	older := CallStreamConfig("geo", Options{})
	older.Duplicates = 15 * time.Minute
	if _, err := js.CreateStream(t.Context(), older); err != nil {
		t.Fatal(err)
	}
	s, err := Stream(t.Context(), js, CallStreamConfig("geo", Options{}))
	if err != nil {
		t.Fatalf("a call stream with the earlier 15-minute window: %v", err)
	}
	if got := s.CachedInfo().Config.Duplicates; got != 15*time.Minute {
		t.Errorf("the existing stream's window became %v", got)
	}
	shorter := CallStreamConfig("ops", Options{})
	shorter.Duplicates = time.Minute
	if _, err := js.CreateStream(t.Context(), shorter); err != nil {
		t.Fatal(err)
	}
	_, err = Stream(t.Context(), js, CallStreamConfig("ops", Options{}))
	var inc *IncompatibleError
	if !errors.As(err, &inc) || !strings.Contains(err.Error(), "duplicate_window") {
		t.Errorf("a 1-minute window: err = %v, want an IncompatibleError naming duplicate_window", err)
	}
}

func TestIncompatibleStreamIsReportedNotReplaced(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	theirs := jetstream.StreamConfig{Name: protocol.ResultStream("geo"), Subjects: []string{"fnresult.geo.>"}, Retention: jetstream.InterestPolicy}
	if _, err := js.CreateStream(t.Context(), theirs); err != nil {
		t.Fatal(err)
	}
	_, err := Stream(t.Context(), js, ResultStreamConfig("geo", 0, Options{}))
	var inc *IncompatibleError
	if !errors.As(err, &inc) {
		t.Fatalf("err = %v, want IncompatibleError", err)
	}
	if !strings.Contains(err.Error(), "retention") || !strings.Contains(err.Error(), "max_msgs_per_subject") {
		t.Errorf("error does not name the differences: %v", err)
	}
	s, err := js.Stream(t.Context(), protocol.ResultStream("geo"))
	if err != nil {
		t.Fatal(err)
	}
	if s.CachedInfo().Config.Retention != jetstream.InterestPolicy {
		t.Error("existing stream was changed")
	}
}

func TestIncompatibleBucketIsReported(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	if _, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: TurnBucket, History: 10}); err != nil {
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

// The contract's specs (package protocol) are what the server gets: every
// stream, bucket and consumer an executor uses is created through the
// named configurations here, read back from a real server and compared
// with its spec.
func TestConfigsMatchProtocolSpecs(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	o := Options{}

	streams := []struct {
		spec protocol.StreamSpec
		cfg  jetstream.StreamConfig
	}{
		{protocol.CallStreamSpec("geo"), CallStreamConfig("geo", o)},
		{protocol.ResultStreamSpec("geo", protocol.DefaultResultStreamBytes), ResultStreamConfig("geo", 0, o)},
		{protocol.DeadLetterStreamSpec(), DeadLetterStreamConfig(o)},
		{protocol.CancelStreamSpec(), CancelStreamConfig(o)},
	}
	if n := len(protocol.ExecutorStreams("geo")) + len(protocol.ControlStreams("geo", 0)); len(streams) != n {
		t.Fatalf("test covers %d streams, protocol.ExecutorStreams and ControlStreams list %d", len(streams), n)
	}
	for _, tc := range streams {
		t.Run("stream "+tc.spec.Name, func(t *testing.T) {
			s, err := Stream(ctx, js, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.spec, streamSpecOf(info.Config)); diff != "" {
				t.Errorf("server's stream differs from the protocol spec (-spec +server):\n%s", diff)
			}
		})
	}

	buckets := []struct {
		spec protocol.BucketSpec
		cfg  BucketConfig
	}{
		{protocol.RegistryBucketSpec(), RegistryBucketConfig(o)},
		{protocol.DeclarationBucketSpec(), DeclarationBucketConfig(o)},
		{protocol.NameBucketSpec(), NameBucketConfig(o)},
		{protocol.AttemptBucketSpec(), AttemptBucketConfig(o)},
	}
	if n := len(protocol.ExecutorBuckets()) + len(protocol.ControlBuckets()); len(buckets) != n {
		t.Fatalf("test covers %d buckets, protocol.ExecutorBuckets and ControlBuckets list %d", len(buckets), n)
	}
	for _, tc := range buckets {
		t.Run("bucket "+tc.spec.Name, func(t *testing.T) {
			kv, err := KeyValue(ctx, js, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			st, err := kv.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			info := st.(*jetstream.KeyValueBucketStatus).StreamInfo()
			got := protocol.BucketSpec{
				Name: st.Bucket(), Description: info.Config.Description, History: int(st.History()),
				TTL: st.TTL(), LimitMarkerTTL: st.LimitMarkerTTL(),
				// Markers need TTLs: the server turns them on with them.
				AllowMsgTTL: info.Config.AllowMsgTTL && st.LimitMarkerTTL() == 0,
			}
			if diff := cmp.Diff(tc.spec, got); diff != "" {
				t.Errorf("server's bucket differs from the protocol spec (-spec +server):\n%s", diff)
			}
		})
	}

	t.Run("function consumer", func(t *testing.T) {
		s, err := js.Stream(ctx, protocol.CallStream("geo"))
		if err != nil {
			t.Fatal(err)
		}
		spec := protocol.FunctionConsumerSpec("geo", "get_weather", 7, 3*time.Second)
		c, err := Consumer(ctx, s, FunctionConsumerConfig("geo", "get_weather", 7, 3*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := info.Config
		got := protocol.ConsumerSpec{
			Durable: h.Durable, Description: h.Description, Stream: info.Stream, FilterSubject: h.FilterSubject,
			AckPolicy: protocol.AckPolicy(jsonName(h.AckPolicy)), DeliverPolicy: protocol.DeliverPolicy(jsonName(h.DeliverPolicy)),
			AckWait: h.AckWait, MaxDeliver: h.MaxDeliver, MaxAckPending: h.MaxAckPending,
		}
		if diff := cmp.Diff(spec, got); diff != "" {
			t.Errorf("server's consumer differs from the protocol spec (-spec +server):\n%s", diff)
		}
	})
}

// streamSpecOf reads a stream's configuration back as a spec. Policies go
// through their JSON names (what protocol's values are), and "no limit",
// which the server stores as -1, reads as a spec's 0.
func streamSpecOf(c jetstream.StreamConfig) protocol.StreamSpec {
	return protocol.StreamSpec{
		Name: c.Name, Description: c.Description, Subjects: c.Subjects,
		Retention: protocol.Retention(jsonName(c.Retention)), Discard: protocol.Discard(jsonName(c.Discard)),
		MaxMsgsPerSubject: max(c.MaxMsgsPerSubject, 0), DiscardNewPerSubject: c.DiscardNewPerSubject,
		MaxAge: c.MaxAge, Duplicates: c.Duplicates, MaxBytes: max(c.MaxBytes, 0), MaxMsgSize: max(c.MaxMsgSize, 0),
		AllowMsgTTL: c.AllowMsgTTL, AllowDirect: c.AllowDirect, AllowMsgSchedules: c.AllowMsgSchedules, AllowRollup: c.AllowRollup,
	}
}

// jsonName is how JetStream's API spells a policy.
func jsonName(v interface{ MarshalJSON() ([]byte, error) }) string {
	b, err := v.MarshalJSON()
	if err != nil {
		panic(err)
	}
	return strings.Trim(string(b), `"`)
}

// Streams and buckets created before toolrelay set per-message TTLs (a
// result stream, the turn bucket) have them turned on in place: what they
// hold stays, and a write with a Nats-TTL is taken from then on.
func TestProvisionTurnsMessageTTLsOn(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()

	older := ResultStreamConfig("geo", 0, Options{})
	older.AllowMsgTTL = false
	if _, err := js.CreateStream(ctx, older); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "fnresult.geo.before", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	ttl := func(subject string) error {
		m := nats.NewMsg(subject)
		m.Header.Set(jetstream.MsgTTLHeader, "1m")
		_, err := js.PublishMsg(ctx, m)
		return err
	}
	if err := ttl("fnresult.geo.refused"); err == nil {
		t.Fatal("a Nats-TTL was taken before the update: the test shows nothing")
	}
	s, err := Stream(ctx, js, ResultStreamConfig("geo", 0, Options{}))
	if err != nil {
		t.Fatalf("a result stream without per-message TTLs: %v", err)
	}
	if !s.CachedInfo().Config.AllowMsgTTL {
		t.Error("the stream still refuses per-message TTLs")
	}
	if _, err := s.GetLastMsgForSubject(ctx, "fnresult.geo.before"); err != nil {
		t.Errorf("the message stored before the update: %v", err)
	}
	if err := ttl("fnresult.geo.after"); err != nil {
		t.Errorf("a Nats-TTL after the update: %v", err)
	}

	old := TurnBucketConfig(Options{}).KeyValueConfig
	if _, err := js.CreateKeyValue(ctx, old); err != nil {
		t.Fatal(err)
	}
	if _, err := KeyValue(ctx, js, TurnBucketConfig(Options{})); err != nil {
		t.Fatalf("a turn bucket without per-message TTLs: %v", err)
	}
	bs, err := js.Stream(ctx, "KV_"+TurnBucket)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := bs.CachedInfo().Config; !cfg.AllowMsgTTL || cfg.SubjectDeleteMarkerTTL != 0 {
		t.Errorf("turn bucket: allow_msg_ttl %t, subject_delete_marker_ttl %s; want true and none", cfg.AllowMsgTTL, cfg.SubjectDeleteMarkerTTL)
	}
	if err := ttl("$KV." + TurnBucket + ".k"); err != nil {
		t.Errorf("a Nats-TTL on the turn bucket: %v", err)
	}
}

// The turn bucket keeps a record written with a Nats-TTL (a closed
// turn's) for that long, and one written without (an open turn's) for the
// bucket's TTL; no delete marker is left behind.
func TestTurnBucketExpiresClosedRecordsOnly(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	kv, err := KeyValue(ctx, js, TurnBucketConfig(Options{}))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "open", []byte(`{"state":"collecting"}`)); err != nil {
		t.Fatal(err)
	}
	closed := nats.NewMsg("$KV." + TurnBucket + ".closed")
	closed.Data = []byte(`{"state":"submitted"}`)
	closed.Header.Set(jetstream.MsgTTLHeader, "1s")
	if _, err := js.PublishMsg(ctx, closed); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := kv.Get(ctx, "closed")
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the closed record is still there after 10 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := kv.Get(ctx, "open"); err != nil {
		t.Errorf("the open record: %v", err)
	}
	s, err := js.Stream(ctx, "KV_"+TurnBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(ctx, "$KV."+TurnBucket+".closed"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the closed record's subject holds %v, want nothing (no marker)", err)
	}
}
