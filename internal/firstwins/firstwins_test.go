package firstwins_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The named constants Lost matches are the server's own codes.
func TestLostKnowsTheServersCodes(t *testing.T) {
	if int(jetstream.JSErrCodeStreamWrongLastSequence) != int(server.JSStreamWrongLastSequenceErrF) ||
		int(jetstream.JSErrCodeStreamWrongLastSequenceConstant) != int(server.JSStreamWrongLastSequenceConstantErr) {
		t.Fatal("nats.go's wrong-last-sequence codes differ from the server's")
	}
}

func result(output string) *protocol.Result {
	key := protocol.NewTurnKey(protocol.PlatformAgents, "as_1", []string{"call_1"}).Call("call_1")
	return &protocol.Result{Version: protocol.Version, Key: key, CallID: "call_1", Team: "orders",
		Function: "get_order", Output: output, FinishedAt: time.Now()}
}

// A second, different result of a call loses to the first, on one server
// and on a replicated stream (where the server's refusal has another code),
// and losing is not an error: some result is recorded, the first.
func TestFirstResultWins(t *testing.T) {
	for _, tc := range []struct {
		name     string
		replicas int
		js       func(t *testing.T) jetstream.JetStream
	}{
		{"single server", 1, func(t *testing.T) jetstream.JetStream { _, js := natstest.Start(t).Connect(t); return js }},
		{"three replicas", 3, func(t *testing.T) jetstream.JetStream { _, js := natstest.StartCluster(t).Connect(t); return js }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			js := tc.js(t)
			ctx := t.Context()
			stream, err := provision.Stream(ctx, js, provision.ResultStreamConfig("orders", 0, provision.Options{Replicas: tc.replicas}))
			if err != nil {
				t.Fatal(err)
			}
			first := result("first")
			if err := firstwins.Record(ctx, js.Conn(), first, nil, 0); err != nil {
				t.Fatalf("first result: %v", err)
			}
			// A repeat of the same publication is deduplicated.
			if err := firstwins.Record(ctx, js.Conn(), first, nil, 0); err != nil {
				t.Fatalf("repeated result: %v", err)
			}
			// A different writer (its message ID differs, as after the
			// dedupe window) is refused by the server...
			second := result("second")
			data, _ := protocol.EncodeResult(second)
			_, err = js.PublishMsg(ctx, &nats.Msg{Subject: second.Subject(), Data: data},
				jetstream.WithMsgID("another-writer"), jetstream.WithExpectLastSequencePerSubject(0))
			if err == nil || !firstwins.Lost(err) {
				t.Fatalf("conflicting publication: %v; want a lost race", err)
			}
			// ...and Record reads that refusal as "already recorded".
			if err := firstwins.Record(ctx, js.Conn(), second, nil, 0); err != nil {
				t.Fatalf("second result: %v", err)
			}
			m, err := stream.GetLastMsgForSubject(ctx, first.Subject())
			if err != nil {
				t.Fatal(err)
			}
			got, err := protocol.DecodeResult(m.Data)
			if err != nil || got.Output != "first" {
				t.Fatalf("recorded %+v (%v); want the first result", got, err)
			}
			info, err := stream.Info(ctx)
			if err != nil || info.State.Msgs != 1 {
				t.Fatalf("stream holds %d messages (%v); want 1", info.State.Msgs, err)
			}
		})
	}
}

func TestLostIsOnlyARace(t *testing.T) {
	for _, err := range []error{nil, context.DeadlineExceeded, jetstream.ErrNoStreamResponse,
		&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamNotFound}} {
		if firstwins.Lost(err) {
			t.Errorf("Lost(%v) = true", err)
		}
	}
}

// A writer that sets no message ID (an executor in another language, say)
// has a result of the call in flight on a replicated stream when Record
// runs, and that proposal never commits: the stream's leader lost its
// followers. The server refuses Record's publication because the subject
// is being written (10164), which does not mean a result is stored, so
// Record must not report one.
func TestAResultStillInFlightIsNotTakenForStored(t *testing.T) {
	cluster := natstest.StartCluster(t)
	nc, js := cluster.Connect(t)
	ctx := t.Context()
	stream, err := provision.Stream(ctx, js, provision.ResultStreamConfig("orders", 0, provision.Options{Replicas: 3}))
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil || info.Cluster == nil || info.Cluster.Leader == "" {
		t.Fatalf("stream info %+v: %v", info, err)
	}
	var leader *server.Server
	for _, s := range cluster.Servers {
		if s.Name() == info.Cluster.Leader {
			leader = s
		}
	}
	nc.Close()
	for _, s := range cluster.Servers {
		if s != leader {
			s.Shutdown()
			s.WaitForShutdown()
		}
	}
	_, js = natstest.Connect(t, leader.ClientURL())
	foreign := result("foreign")
	data, _ := protocol.EncodeResult(foreign)
	// The foreign write goes out first and stays unanswered.
	if _, err := js.PublishMsgAsync(&nats.Msg{Subject: foreign.Subject(), Data: data},
		jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	err = firstwins.Record(rctx, js.Conn(), result("ours"), nil, 0)
	t.Logf("Record: %v", err)
	if err == nil {
		t.Fatal("Record reported a result stored while none is: the only other write is still in flight")
	}
}

// waitGone polls until subject of s holds nothing, failing after within.
func waitGone(t *testing.T, s jetstream.Stream, subject string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		_, err := s.GetLastMsgForSubject(t.Context(), subject)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds a message after %s (last error %v)", subject, within, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A result recorded with a TTL carries it as its Nats-TTL, and the server
// removes it once it passes; the subject then takes a result again.
func TestRecordedResultExpiresWithItsTTL(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	s, err := provision.Stream(ctx, js, provision.ResultStreamConfig("orders", 0, provision.Options{}))
	if err != nil {
		t.Fatal(err)
	}
	res := result("short-lived")
	if err := firstwins.Record(ctx, js.Conn(), res, nil, time.Second); err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(ctx, res.Subject())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(jetstream.MsgTTLHeader); got != "1s" {
		t.Errorf("Nats-TTL = %q, want 1s", got)
	}
	waitGone(t, s, res.Subject(), 10*time.Second)

	kept := result("kept")
	kept.Key = protocol.NewTurnKey(protocol.PlatformAgents, "as_2", []string{"call_1"}).Call("call_1")
	if err := firstwins.Record(ctx, js.Conn(), kept, nil, 0); err != nil {
		t.Fatal(err)
	}
	if m, err = s.GetLastMsgForSubject(ctx, kept.Subject()); err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(jetstream.MsgTTLHeader); got != "" {
		t.Errorf("a result recorded without a TTL carries Nats-TTL %q", got)
	}
}

// A result stream a dispatcher older than per-message TTLs created, not
// yet updated, refuses a Nats-TTL: the result is recorded without one.
func TestRecordOnAStreamWithoutTTLs(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	older := provision.ResultStreamConfig("orders", 0, provision.Options{})
	older.AllowMsgTTL = false
	s, err := js.CreateStream(ctx, older)
	if err != nil {
		t.Fatal(err)
	}
	res := result("recorded all the same")
	if err := firstwins.Record(ctx, js.Conn(), res, nil, time.Minute); err != nil {
		t.Fatalf("record with a TTL on a stream without TTLs: %v", err)
	}
	m, err := s.GetLastMsgForSubject(ctx, res.Subject())
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Header.Get(jetstream.MsgTTLHeader); got != "" {
		t.Errorf("Nats-TTL = %q, want none", got)
	}
	// A second result still loses to it.
	if err := firstwins.Record(ctx, js.Conn(), result("second"), nil, time.Minute); err != nil {
		t.Fatalf("second result: %v", err)
	}
}

// What an executor that does not follow the protocol can do with the
// Nats-TTL of its results: a TTL the server cannot read is refused and
// stores nothing; a TTL past the stream's MaxAge is cut by MaxAge; "never"
// outlives MaxAge, and only the stream's MaxBytes, its own team's, bounds
// it (docs/protocol.md).
func TestResultTTLsAnExecutorChooses(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	cfg := provision.ResultStreamConfig("orders", 4<<10, provision.Options{})
	cfg.MaxAge, cfg.Duplicates = 2*time.Second, time.Second
	s, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	publish := func(subject, ttl string, size int) error {
		m := nats.NewMsg(subject)
		m.Data = make([]byte, size)
		m.Header.Set(jetstream.MsgTTLHeader, ttl)
		_, err := js.PublishMsg(ctx, m)
		return err
	}
	for _, ttl := range []string{"-5s", "500ms", "soon"} {
		if err := publish("fnresult.orders.t.bad", ttl, 10); err == nil {
			t.Errorf("Nats-TTL %q was taken", ttl)
		}
	}
	if _, err := s.GetLastMsgForSubject(ctx, "fnresult.orders.t.bad"); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("a refused result was stored: %v", err)
	}
	if err := publish("fnresult.orders.t.huge", "1000h", 10); err != nil {
		t.Fatal(err)
	}
	if err := publish("fnresult.orders.t.never", "never", 10); err != nil {
		t.Fatal(err)
	}
	waitGone(t, s, "fnresult.orders.t.huge", 10*time.Second)
	if _, err := s.GetLastMsgForSubject(ctx, "fnresult.orders.t.never"); err != nil {
		t.Errorf("a result with Nats-TTL never, past MaxAge: %v", err)
	}
	// Pinned results fill the team's own stream, and then it refuses more.
	var full error
	for i := 0; i < 10 && full == nil; i++ {
		full = publish(fmt.Sprintf("fnresult.orders.t.fill%d", i), "never", 1<<10)
	}
	if full == nil {
		t.Error("a 4 KiB result stream took 10 KiB of pinned results")
	}
}
