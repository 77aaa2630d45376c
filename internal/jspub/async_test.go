package jspub_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/internal/natstest"
)

// await waits for f's answer, failing the test if none comes within 10 s.
func await(t *testing.T, f *jspub.Future) (uint64, error) {
	t.Helper()
	select {
	case <-f.Done():
		return f.Result()
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10 s")
		return 0, nil
	}
}

// Every kind of answer comes back as jetstream's own PublishMsgAsync gives
// it: an acknowledgement, a duplicate, a failed expectation (the server's
// error, with its code) and no stream at all (after its retries).
func TestAsyncAnswersAsJetStreamDoes(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
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
	a := jspub.NewAsync(nc, 64, 5*time.Second)
	defer a.Close()
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
		jf, err := js.PublishMsgAsync(msg("VIA_JETSTREAM", c.subject, c.id, c.seq))
		if err != nil {
			t.Fatal(err)
		}
		var want uint64
		var wantErr error
		select {
		case ack := <-jf.Ok():
			want = ack.Sequence
		case wantErr = <-jf.Err():
		case <-time.After(10 * time.Second):
			t.Fatal("jetstream: no answer")
		}
		f, err := a.Publish(msg("VIA_JSPUB", c.subject, c.id, c.seq))
		if err != nil {
			t.Fatal(err)
		}
		got, err := await(t, f)
		if got != want || !sameError(err, wantErr) {
			t.Errorf("%s: jspub %d, %v; jetstream %d, %v", c.name, got, err, want, wantErr)
		}
	}
	start := time.Now()
	f, err := a.Publish(msg("NOWHERE", "a", "", ""))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := await(t, f); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("no stream: %v; want ErrNoStreamResponse", err)
	}
	if waited := time.Since(start); waited < jetstream.DefaultPubRetryWait*time.Duration(jetstream.DefaultPubRetryAttempts) {
		t.Errorf("no stream: answered after %v, before its %d retries %v apart", waited, jetstream.DefaultPubRetryAttempts, jetstream.DefaultPubRetryWait)
	}
	if n := a.Pending(); n != 0 {
		t.Errorf("%d publications still pending after every answer", n)
	}
	if _, err := a.Publish(&nats.Msg{Subject: "VIA_JSPUB.a", Reply: "mine"}); !errors.Is(err, jetstream.ErrAsyncPublishReplySubjectSet) {
		t.Errorf("a message with its own reply subject: %v", err)
	}
}

// A stream that appears while a publication meets "no responders" (a
// leader being elected) takes it at the retry.
func TestAsyncPublishesAgainAfterNoResponders(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	a := jspub.NewAsync(nc, 64, 5*time.Second)
	defer a.Close()
	f, err := a.Publish(&nats.Msg{Subject: "LATE.a", Data: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "LATE", Subjects: []string{"LATE.>"}}); err != nil {
		t.Fatal(err)
	}
	if seq, err := await(t, f); err != nil || seq != 1 {
		t.Fatalf("published before its stream existed: %d, %v; want stored at 1 by a retry", seq, err)
	}
}

// At most maxPending publications wait for answers: one more waits for a
// slot, then is refused as stalled. Closing fails what is pending and
// refuses what comes after.
func TestAsyncStallsAtMaxPendingAndCloseFailsThePending(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	sub, err := nc.SubscribeSync("silent.>") // takes each publication, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	a := jspub.NewAsync(nc, 2, 5*time.Second)
	var held []*jspub.Future
	for range 2 {
		f, err := a.Publish(nats.NewMsg("silent.a"))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, f)
	}
	if _, err := a.Publish(nats.NewMsg("silent.a")); !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
		t.Fatalf("a third publication with two pending: %v; want ErrTooManyStalledMsgs", err)
	}
	// An answer frees a slot.
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Respond([]byte(`{"stream":"S","seq":5}`)); err != nil {
		t.Fatal(err)
	}
	if seq, err := await(t, held[0]); err != nil || seq != 5 {
		t.Fatalf("answered: %d, %v", seq, err)
	}
	if _, err := a.Publish(nats.NewMsg("silent.a")); err != nil {
		t.Fatalf("publishing into the freed slot: %v", err)
	}
	a.Close()
	for _, f := range held[1:] {
		if _, err := await(t, f); !errors.Is(err, nats.ErrConnectionClosed) {
			t.Fatalf("pending at Close: %v; want ErrConnectionClosed", err)
		}
	}
	if _, err := a.Publish(nats.NewMsg("silent.a")); !errors.Is(err, nats.ErrConnectionClosed) {
		t.Fatalf("after Close: %v; want ErrConnectionClosed", err)
	}
	a.Close() // twice is harmless
}

// A publication pending when the connection drops fails at once with
// nats.ErrDisconnected, which may pass, instead of waiting for an answer
// lost with the connection.
func TestAsyncFailsThePendingWhenTheConnectionDrops(t *testing.T) {
	srv := natstest.Start(t)
	nc, _ := srv.Connect(t)
	sub, err := nc.SubscribeSync("silent.>")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	a := jspub.NewAsync(nc, 8, 5*time.Second)
	defer a.Close()
	f, err := a.Publish(nats.NewMsg("silent.a"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(10 * time.Second); err != nil { // it went out
		t.Fatal(err)
	}
	if err := nc.ForceReconnect(); err != nil {
		t.Fatal(err)
	}
	if _, err := await(t, f); !errors.Is(err, nats.ErrDisconnected) {
		t.Fatalf("pending as the connection dropped: %v; want ErrDisconnected", err)
	}
}

// BenchmarkAsync publishes and waits for each answer, through jspub and
// through jetstream's own asynchronous publisher: compare allocs/op.
func BenchmarkAsync(b *testing.B) {
	nc, js := natstest.Start(b).Connect(b)
	if _, err := js.CreateStream(b.Context(), jetstream.StreamConfig{Name: "B", Subjects: []string{"B.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		b.Fatal(err)
	}
	data := []byte("x")
	b.Run("jspub", func(b *testing.B) {
		a := jspub.NewAsync(nc, 64, 5*time.Second)
		defer a.Close()
		for b.Loop() {
			f, err := a.Publish(&nats.Msg{Subject: "B.a", Data: data})
			if err != nil {
				b.Fatal(err)
			}
			<-f.Done()
			if _, err := f.Result(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("jetstream", func(b *testing.B) {
		for b.Loop() {
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: "B.a", Data: data})
			if err != nil {
				b.Fatal(err)
			}
			select {
			case <-f.Ok():
			case err := <-f.Err():
				b.Fatal(err)
			}
		}
	})
}

// A publication whose answer never comes, with the connection up all the
// while (the server that took it went away), fails with
// ErrAsyncPublishTimeout, which may pass, once its timeout is over, and
// frees its slot; one answered in time is not touched.
func TestAsyncTimesOutWhatIsNeverAnswered(t *testing.T) {
	nc, _ := natstest.Start(t).Connect(t)
	sub, err := nc.SubscribeSync("silent.>") // takes each publication, never answers
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	const timeout = 300 * time.Millisecond
	a := jspub.NewAsync(nc, 8, timeout)
	defer a.Close()
	start := time.Now()
	lost, err := a.Publish(nats.NewMsg("silent.a"))
	if err != nil {
		t.Fatal(err)
	}
	answered, err := a.Publish(nats.NewMsg("silent.b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sub.NextMsg(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	m, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Respond([]byte(`{"stream":"S","seq":9}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := await(t, lost); !errors.Is(err, jetstream.ErrAsyncPublishTimeout) || !jsretry.MayPass(err) {
		t.Fatalf("never answered: %v; want ErrAsyncPublishTimeout, which may pass", err)
	}
	if waited := time.Since(start); waited < timeout {
		t.Fatalf("timed out after %v, before its timeout of %v", waited, timeout)
	}
	if seq, err := await(t, answered); err != nil || seq != 9 {
		t.Fatalf("answered in time: %d, %v", seq, err)
	}
	if n := a.Pending(); n != 0 {
		t.Fatalf("%d still pending", n)
	}
}
