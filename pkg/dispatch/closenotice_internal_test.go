package dispatch

import (
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A wait hears every write of the record, and ends only on a close that
// was stored: a write that lost its compare-and-set (a cancel racing the
// submission, say) is heard by the subscription too, and must not be
// taken for the turn's outcome.
func TestAwaitClosedTakesOnlyAStoredClose(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	d := replicaOn(t, js, "one", idlePlatform{})
	key := protocol.TurnKey("abcdefabcdefabcdefabcdefabcdef01")
	turn := &Turn{Version: protocol.Version, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_1"},
		State: TurnCollecting, CreatedAt: time.Now().UTC(), ExpiresAt: time.Now().Add(time.Minute), Deadline: time.Now().Add(30 * time.Second)}
	rev, err := d.turns.create(t.Context(), turn)
	if err != nil {
		t.Fatal(err)
	}

	// The wait's subscription, counted by the server among those that
	// hear the record's subject (a count of the connection's would take
	// in those the startup's sweep makes and drops meanwhile).
	recordSubs := func() int {
		sz, err := srv.Subsz(&server.SubszOptions{Subscriptions: true, Test: kvSubject(provision.TurnBucket, string(key))})
		if err != nil {
			t.Fatal(err)
		}
		return sz.Total
	}
	subs := recordSubs()
	type outcome struct {
		turn *Turn
		err  error
	}
	got := make(chan outcome, 1)
	go func() {
		t, _, _, err := d.awaitClosed(t.Context(), key, nil, Ref{})
		got <- outcome{t, err}
	}()
	testutil.WaitForWhat(t, 10*time.Second, "the wait's subscription to the record", func() bool { return recordSubs() > subs })

	forged := turn.clone()
	forged.State = TurnSubmitted
	b, err := appendTurn(nil, forged)
	if err != nil {
		t.Fatal(err)
	}
	m := &nats.Msg{Subject: kvSubject(provision.TurnBucket, string(key)), Data: b,
		Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(rev+100, 10)}}}
	if _, err := jspub.Publish(t.Context(), d.turns.nc, m); !firstwins.Lost(err) {
		t.Fatalf("the forged close was not refused by the compare-and-set: %v", err)
	}

	// Another replica fails the turn: no notice in this process, only the
	// record.
	failed := turn.clone()
	failed.State = TurnFailed
	failed.writeOutcome().Error = "cancelled elsewhere"
	if _, err := d.turns.update(t.Context(), failed, rev); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-got:
		if o.err != nil || o.turn.State != TurnFailed || o.turn.Outcome().Error != "cancelled elsewhere" {
			t.Fatalf("the wait ended with %+v, %v; want the stored close, failed", o.turn, o.err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the wait did not end on the stored close")
	}
	testutil.WaitForWhat(t, 10*time.Second, "the wait's subscription to be dropped", func() bool { return recordSubs() == subs })
}

// A turn closed here reaches each of its waiters once, with its outputs;
// a wait that stopped gets nothing, and other turns' waits are untouched.
func TestCloseNoticesReachTheirWaiters(t *testing.T) {
	var n closeNotices
	a1, stop1 := n.wait("a")
	a2, stop2 := n.wait("a")
	gone, stopGone := n.wait("a")
	other, stopOther := n.wait("b")
	defer stop1()
	defer stop2()
	defer stopOther()
	stopGone()

	closed := &Turn{Key: "a", State: TurnSubmitted}
	outputs := []Output{{Call: TurnCall{ID: "c"}}}
	n.closed(closed, outputs)
	n.closed(closed, outputs) // nobody waits any more: nothing blocks
	for _, ch := range []<-chan closeNotice{a1, a2} {
		select {
		case got := <-ch:
			if got.turn != closed || len(got.outputs) != 1 {
				t.Fatalf("notice %+v; want the closed turn and its outputs", got)
			}
		default:
			t.Fatal("a waiter of the closed turn got no notice")
		}
	}
	select {
	case got := <-gone:
		t.Fatalf("a stopped wait got %+v", got)
	case got := <-other:
		t.Fatalf("another turn's wait got %+v", got)
	default:
	}
	if len(n.waiting) != 1 {
		t.Errorf("%d turns still waited for; want only b's", len(n.waiting))
	}
}
