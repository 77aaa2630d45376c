package firstwins_test

import (
	"context"
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
			if err := firstwins.Record(ctx, js.Conn(), first, nil); err != nil {
				t.Fatalf("first result: %v", err)
			}
			// A repeat of the same publication is deduplicated.
			if err := firstwins.Record(ctx, js.Conn(), first, nil); err != nil {
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
			if err := firstwins.Record(ctx, js.Conn(), second, nil); err != nil {
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
	err = firstwins.Record(rctx, js.Conn(), result("ours"), nil)
	t.Logf("Record: %v", err)
	if err == nil {
		t.Fatal("Record reported a result stored while none is: the only other write is still in flight")
	}
}
