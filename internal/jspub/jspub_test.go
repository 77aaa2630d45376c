package jspub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/natstest"
)

// Against a real server, every kind of answer comes back as jetstream's
// own PublishMsg returns it: an acknowledgement, a duplicate, a failed
// expectation (the server's error, with its code) and no stream at all.
func TestPublishAnswersAsJetStreamDoes(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	// Two streams alike: jetstream publishes to one, jspub to the other,
	// the same messages in the same order.
	for _, name := range []string{"VIA_JETSTREAM", "VIA_JSPUB"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(stream, subject, id, lastSeq string) *nats.Msg {
		m := nats.NewMsg(stream + "." + subject)
		m.Data = []byte("x")
		if id != "" {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
		if lastSeq != "" {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, lastSeq)
		}
		return m
	}
	for _, c := range []struct {
		name             string
		subject, id, seq string
	}{
		{"stored", "a", "", ""},
		{"with a message ID", "b", "id-1", ""},
		{"a duplicate", "b", "id-1", ""},
		{"expected last sequence met", "c", "", "0"},
		{"expected last sequence missed", "c", "", "0"},
	} {
		ack, wantErr := js.PublishMsg(ctx, msg("VIA_JETSTREAM", c.subject, c.id, c.seq))
		var want uint64
		if ack != nil {
			want = ack.Sequence
		}
		got, err := jspub.Publish(ctx, nc, msg("VIA_JSPUB", c.subject, c.id, c.seq))
		if got != want || !sameError(err, wantErr) {
			t.Errorf("%s: jspub %d, %v; jetstream %d, %v", c.name, got, err, want, wantErr)
		}
	}
	if _, err := jspub.Publish(ctx, nc, msg("NOWHERE", "a", "", "")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("no stream: %v; want ErrNoStreamResponse", err)
	}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y *jetstream.APIError
	if errors.As(a, &x) != errors.As(b, &y) {
		return false
	}
	return x == nil || (x.ErrorCode == y.ErrorCode && x.Code == y.Code && a.Error() == b.Error())
}

// An acknowledgement that never comes (a server that went away with it)
// ends the wait after DefaultTimeout when the caller set no deadline, as
// jetstream's PublishMsg does, rather than holding the caller forever.
func TestPublishWithoutADeadlineGivesUp(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	sub, err := nc.SubscribeSync("silent.>") // takes the request, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	done := make(chan error, 1)
	go func() {
		_, err := jspub.Publish(context.Background(), nc, nats.NewMsg("silent.a"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a lost acknowledgement: %v; want the deadline", err)
		}
	case <-time.After(3 * jspub.DefaultTimeout):
		t.Fatal("Publish without a deadline still waiting after three times DefaultTimeout")
	}
}
