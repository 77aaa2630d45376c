package jspub_test

import (
	"context"
	"errors"
	"fmt"
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

// SetHeaders sets what Header.Set would, keeps what was there, and leaves
// each value on its own: adding to one key changes no other.
func TestSetHeadersIsHeaderSet(t *testing.T) {
	h := nats.Header{}
	h.Set("Traceparent", "00-abc-def-01")
	got := jspub.SetHeaders(h, "A", "1", "B", "2", "Traceparent", "00-new-01")
	want := nats.Header{}
	want.Set("Traceparent", "00-abc-def-01")
	for _, kv := range [][2]string{{"A", "1"}, {"B", "2"}, {"Traceparent", "00-new-01"}} {
		want.Set(kv[0], kv[1])
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("SetHeaders gave %v, Header.Set %v", got, want)
	}
	got.Add("A", "3")
	if a, b := got.Values("A"), got.Values("B"); len(a) != 2 || a[1] != "3" || len(b) != 1 || b[0] != "2" {
		t.Fatalf("after Add to A: A=%v B=%v", a, b)
	}
	if fresh := jspub.SetHeaders(nil, "Nats-Msg-Id", "x"); fresh.Get("Nats-Msg-Id") != "x" {
		t.Fatalf("SetHeaders on nil gave %v", fresh)
	}
}
