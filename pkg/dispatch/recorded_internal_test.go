package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A restarted replica learns which results of the open turns are recorded
// from one listing of each team's result stream, not from a request per
// turn (0.8 ms a turn, 83 s at 100,000 open turns), and still finds a turn
// whose results all came while it was down: that one is re-checked (and so
// submitted); one still waiting is not, its results reach the replica
// now that it gathers for it. A second listing, once every turn is
// re-armed, finds what was recorded in between (below).
func TestARestartLearnsTheRecordedResultsFromOneListing(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, srv, js := provisioned(t, Options{Name: "one", Logger: testutil.Logger(t)})
	d.spawn = func(func(context.Context)) {} // the re-checks the sweep schedules run nowhere
	if _, err := d.gather.streams.stream(ctx, "geo"); err != nil {
		t.Fatal(err)
	}
	// Older than the calls' duplicates window: none is published again,
	// so nothing here needs the team's call stream.
	now := time.Now()
	var keys []protocol.TurnKey
	for i := range 20 {
		tn, _ := openRecord(t, d, fmt.Sprintf("resp_%d", i), now.Add(-3*time.Minute), now.Add(5*time.Minute), "get_weather", "get_city")
		keys = append(keys, tn.Key)
		// Every turn has call_1's result; the first has both, recorded
		// (and acknowledged by the replica that died) while this one was
		// down.
		recorded := 1
		if i == 0 {
			recorded = 2
		}
		for c := range recorded {
			res := &protocol.Result{Version: protocol.Version, Key: tn.Calls[c].Key, CallID: tn.Calls[c].ID, Team: "geo",
				Function: tn.Calls[c].Name, Output: "ok", FinishedAt: now.UTC()}
			if err := firstwins.Record(ctx, js.Conn(), res, nil, 0); err != nil {
				t.Fatal(err)
			}
		}
	}
	counter, _ := srv.Connect(t)
	infos, err := counter.SubscribeSync("$JS.API.STREAM.INFO." + protocol.ResultStream("geo"))
	if err != nil {
		t.Fatal(err)
	}
	if err := counter.Flush(); err != nil {
		t.Fatal(err)
	}

	d.sweep(ctx, true)

	if err := d.js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 5*time.Second, "the listings' requests", func() bool { n, _, _ := infos.Pending(); return n >= 2 })
	if err := counter.Flush(); err != nil { // what the dispatcher sent before its flush has arrived
		t.Fatal(err)
	}
	if n, _, _ := infos.Pending(); n != 2 {
		t.Errorf("the restart asked the result stream %d times for 20 open turns, want a listing before re-arming them and one after", n)
	}
	for i, key := range keys {
		d.gather.mu.Lock()
		st := d.gather.turns[key]
		rechecked := st != nil && st.recheck != nil
		d.gather.mu.Unlock()
		if st == nil {
			t.Fatalf("turn %d was not re-armed", i)
		}
		if want := i == 0; rechecked != want {
			t.Errorf("turn %d (results recorded: all %v): re-checked %v, want %v", i, want, rechecked, want)
		}
	}
}

// A result recorded after a restart's listing, while its turn was not yet
// gathered for here, reached this replica and was passed by; no other
// replica gathers for the turn. The second listing, made once every turn
// is re-armed, finds the turn complete and has it looked at; a turn it
// finds no more complete is not.
func TestARestartFindsWhatWasRecordedWhileItReArmed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, _, js := provisioned(t, Options{Name: "one", Logger: testutil.Logger(t)})
	d.spawn = func(func(context.Context)) {} // the re-checks run nowhere
	if _, err := d.gather.streams.stream(ctx, "geo"); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	record := func(tn *Turn, c int) {
		res := &protocol.Result{Version: protocol.Version, Key: tn.Calls[c].Key, CallID: tn.Calls[c].ID, Team: "geo",
			Function: tn.Calls[c].Name, Output: "ok", FinishedAt: now.UTC()}
		if err := firstwins.Record(ctx, js.Conn(), res, nil, 0); err != nil {
			t.Fatal(err)
		}
	}
	completed, rev1 := openRecord(t, d, "resp_completed", now.Add(-3*time.Minute), now.Add(5*time.Minute), "get_weather", "get_city")
	waiting, rev2 := openRecord(t, d, "resp_waiting", now.Add(-3*time.Minute), now.Add(5*time.Minute), "get_weather", "get_city")
	record(completed, 0)
	record(waiting, 0)
	listed := map[protocol.TurnKey]bool{completed.Key: true, waiting.Key: true}
	known, err := d.gather.recordedOf(ctx, listed)
	if err != nil {
		t.Fatal(err)
	}
	record(completed, 1) // after the listing, before the turn is gathered for
	d.gather.track(completed, rev1)
	d.gather.track(waiting, rev2)

	d.recheckCompletedSince(ctx, listed, known)

	for _, c := range []struct {
		turn *Turn
		want bool
	}{{completed, true}, {waiting, false}} {
		d.gather.mu.Lock()
		rechecked := d.gather.turns[c.turn.Key].recheck != nil
		d.gather.mu.Unlock()
		if rechecked != c.want {
			t.Errorf("%s: looked at again %v, want %v", c.turn.Ref.ResponseID, rechecked, c.want)
		}
	}
}
