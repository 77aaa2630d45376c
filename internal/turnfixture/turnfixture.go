// Package turnfixture writes turn records as dispatchers leave them, for
// tests and benchmarks of what reads them (the inspection API, the
// console) at a scale no test could reach by driving real turns.
package turnfixture

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Open writes n open turn records (Agents sessions, one get_order call of
// team orders each) into the turn bucket, and their entries in the index
// of open turns (their timer subjects), as n turns taken in by some
// replica would leave them. The bucket and streams must exist (a
// dispatcher has run). Deadlines are 10 to 19 minutes away, so that
// nothing closes the turns while a test runs; a dispatcher's sweep would
// re-arm them after 15 seconds, so give it a long SweepInterval.
func Open(tb testing.TB, js jetstream.JetStream, n int) {
	tb.Helper()
	now := time.Now().UTC()
	for i := range n {
		scope := fmt.Sprintf("sess_%d/turn_1", i)
		key := protocol.NewTurnKey(protocol.PlatformAgents, scope, []string{"call_1"})
		t := dispatch.Turn{Version: 1, Key: key, Ref: dispatch.Ref{Platform: protocol.PlatformAgents, SessionID: fmt.Sprintf("sess_%d", i)},
			Scope: scope, State: dispatch.TurnCollecting, CreatedAt: now,
			ExpiresAt: now.Add(20 * time.Minute), Deadline: now.Add(10*time.Minute + time.Duration(i%540)*time.Second),
			Calls: []dispatch.TurnCall{{ID: "call_1", Name: "get_order", Key: key.Call("call_1"), Team: "orders", Arguments: json.RawMessage(`{}`)}}}
		b, err := json.Marshal(&t)
		if err != nil {
			tb.Fatal(err)
		}
		publish(tb, js, provision.TimerSubjectPrefix+".sched."+string(key), []byte(key))
		publish(tb, js, "$KV."+provision.TurnBucket+"."+string(key), b)
	}
	drained(tb, js)
}

// publish publishes asynchronously; when too many publications await
// their acks (a slow machine), it lets them drain and tries again.
func publish(tb testing.TB, js jetstream.JetStream, subject string, data []byte) {
	for {
		_, err := js.PublishAsync(subject, data)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			if err != nil {
				tb.Fatal(err)
			}
			return
		}
		drained(tb, js)
	}
}

func drained(tb testing.TB, js jetstream.JetStream) {
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(30 * time.Second):
		tb.Fatal("turnfixture: writing turn records took over 30s")
	}
}

// Dispatcher starts a dispatcher on its own JetStream server, with no
// platform (none is needed to read turns) and no sweep while the test
// runs, and writes n open turns (Open) once it is ready. It stops when the
// test ends.
func Dispatcher(tb testing.TB, n int) (*dispatch.Dispatcher, jetstream.JetStream) {
	tb.Helper()
	srv := natstest.Start(tb)
	_, js := srv.Connect(tb)
	d, err := dispatch.New(js, nil, dispatch.Options{Logger: testutil.Logger(tb), SweepInterval: time.Hour})
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	tb.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(tb, 20*time.Second, "the dispatcher to be ready", d.Ready) // provisioned: the records can be written
	Open(tb, js, n)
	return d, js
}
