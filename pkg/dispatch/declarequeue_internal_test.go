package dispatch

import (
	"context"
	"encoding/json"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Of a team's waiting requests, those that only renew live declarations
// are taken in first; a full queue is refused at once; each team's
// requests are taken in by its own worker, which ends when idle.
func TestDeclareQueueServesRenewalsFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	var mu sync.Mutex
	var order []string
	gate := make(chan struct{})
	busy := 0
	q := &declareQueues{ctx: ctx, depth: 4, sem: make(chan struct{}, 2), teams: map[string]*teamQueue{},
		take: func(_ context.Context, team string, req *protocol.DeclareRequest) *protocol.DeclareReply {
			name := req.Declarations[0].Spec.Name
			if name == "first" {
				<-gate // holds the worker while the others queue
			}
			mu.Lock()
			order = append(order, team+"/"+name)
			mu.Unlock()
			return &protocol.DeclareReply{}
		},
		renew: func(req *protocol.DeclareRequest) bool { return req.Declarations[0].Spec.Name == "renewal" },
		busy:  func(string) { busy++ },
	}
	msg := func(team, name string) *nats.Msg {
		req := protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareServe, Declarations: []protocol.Declaration{{
			Version: protocol.Version, Instance: "i", StartedAt: time.Now(),
			Spec: protocol.FunctionSpec{Version: protocol.Version, Name: name, Team: team, Parameters: []byte(`{}`)}}}}
		b, _ := json.Marshal(&req)
		return &nats.Msg{Subject: protocol.DeclareSubject(team), Data: b}
	}
	q.enqueue(msg("orders", "first"))
	testutil.WaitForWhat(t, 10*time.Second, "the first request to be taken", func() bool {
		q.mu.Lock()
		defer q.mu.Unlock()
		return len(q.teams["orders"].pending) == 0
	})
	q.enqueue(msg("orders", "new1"))
	q.enqueue(msg("orders", "new2"))
	q.enqueue(msg("orders", "renewal"))
	q.enqueue(msg("orders", "refused")) // the fifth: over the depth of 4
	if busy != 1 {
		t.Fatalf("%d requests refused as busy, want the fifth", busy)
	}
	q.enqueue(msg("billing", "other"))
	testutil.WaitForWhat(t, 10*time.Second, "billing's request, with orders' worker held", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Contains(order, "billing/other")
	})
	close(gate)
	testutil.WaitForWhat(t, 10*time.Second, "orders' requests", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) == 5
	})
	want := []string{"billing/other", "orders/first", "orders/renewal", "orders/new1", "orders/new2"}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(order, want) {
		t.Fatalf("taken in as %v, want %v", order, want)
	}
	cancel()
	q.wait()
}
