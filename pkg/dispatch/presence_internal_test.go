package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// replica starts a dispatcher named name on js whose responses never
// finish, so its watches stay active.
func replica(t testing.TB, js jetstream.JetStream, name string) *Dispatcher {
	t.Helper()
	return replicaOn(t, js, name, idlePlatform{})
}

// replicaOn is replica on platform p, with tune applied before it runs.
func replicaOn(t testing.TB, js jetstream.JetStream, name string, p Platform, tune ...func(*Dispatcher)) *Dispatcher {
	t.Helper()
	d, err := New(js, []Platform{p}, Options{Name: name, Logger: testutil.Logger(t), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tune {
		f(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 30*time.Second, "replica "+name+" to be ready", d.Ready)
	return d
}

// rewriteWatch changes the stored record of watch id as another replica
// would, by compare-and-set.
// rewriteWatch changes the stored watch as another replica would: by
// compare-and-set, read again when the driver saved it meanwhile (it may
// save every few milliseconds here).
func rewriteWatch(t *testing.T, d *Dispatcher, id string, change func(*Watch)) {
	t.Helper()
	testutil.WaitForWhat(t, 10*time.Second, "the watch to be rewritten", func() bool {
		have, rev := storedWatch(t, d, id)
		change(have)
		b, _ := json.Marshal(have)
		_, err := d.watches.Update(t.Context(), id, b, rev)
		if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Fatal(err)
		}
		return err == nil
	})
}

func storedWatch(t *testing.T, d *Dispatcher, id string) (*Watch, uint64) {
	t.Helper()
	e, err := d.watches.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var w Watch
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		t.Fatal(err)
	}
	return &w, e.Revision()
}

// A replica that starts (a deploy, a restart) must not take the watches a
// running replica drives: it used to take every active watch at its
// startup sweep, and each was then driven by both, polling the platform
// twice, for good.
func TestARestartLeavesTheWatchesARunningReplicaDrives(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	one := replica(t, js, "one")
	w, err := one.Watch(t.Context(), Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_driven"})
	if err != nil {
		t.Fatal(err)
	}
	two := replica(t, js, "two")
	two.sweepWatches(t.Context(), true)
	if two.driving(w.ID) {
		t.Fatal("the starting replica took a watch that a running replica drives")
	}
	if have, _ := storedWatch(t, two, w.ID); have.Driver != "one" || !one.driving(w.ID) {
		t.Fatalf("watch driver %q (one driving: %v), want still one", have.Driver, one.driving(w.ID))
	}
}

// A watch whose driver was killed (its record not stale, not released) is
// taken at the next sweep of another replica once a save is missed, not a
// minute later: nothing answers on the dead replica's presence subject.
func TestAKilledReplicasWatchIsTakenAtTheNextSweep(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	two := replica(t, js, "two")
	// Saved 26 s ago: past its driver's save period (so it missed one), not
	// yet stale (a minute).
	now := time.Now().UTC().Add(-(watchSaveEvery + presenceGrace + time.Second))
	orphan := &Watch{ID: watchID(Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_orphan"}),
		Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_orphan"}, State: WatchActive,
		CreatedAt: now, UpdatedAt: now, Driver: "killed"}
	orphan.Current = orphan.Ref
	b, _ := json.Marshal(orphan)
	if _, err := two.watches.Create(t.Context(), orphan.ID, b); err != nil {
		t.Fatal(err)
	}
	two.sweepWatches(t.Context(), false)
	// Taken: the replica's own sweep may be the one that takes it, and be
	// starting the driver as this one returns.
	testutil.WaitForWhat(t, 5*time.Second, "replica two to drive the orphaned watch", func() bool { return two.driving(orphan.ID) })
	if have, _ := storedWatch(t, two, orphan.ID); have.Driver != "two" {
		t.Fatalf("watch driver %q after the take, want two", have.Driver)
	}
}

// A driver whose watch another replica took (it thought this one gone)
// steps aside at its next save instead of driving beside the new driver,
// and leaves the record as the new driver wrote it.
func TestADriverStepsAsideWhenItsWatchIsTaken(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	one := replicaOn(t, js, "one", idlePlatform{}, func(d *Dispatcher) { d.watchSaveEvery = 20 * time.Millisecond })
	w, err := one.Watch(t.Context(), Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_taken"})
	if err != nil {
		t.Fatal(err)
	}
	rewriteWatch(t, one, w.ID, func(have *Watch) { have.Driver, have.UpdatedAt = "two", time.Now().UTC() })
	testutil.WaitForWhat(t, 15*time.Second, "replica one to step aside from the watch two took", func() bool { return !one.driving(w.ID) })
	if after, _ := storedWatch(t, one, w.ID); after.Driver != "two" || after.Released || after.State != WatchActive {
		t.Fatalf("after stepping aside the record says driver %q, released %v, state %s; want two's, not released, active", after.Driver, after.Released, after.State)
	}
}

// A driver whose watch another replica finished steps aside too, and its
// keep-alive does not write its stale copy back over the outcome.
func TestADriverLeavesAWatchAnotherReplicaFinished(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	one := replicaOn(t, js, "one", idlePlatform{}, func(d *Dispatcher) { d.watchSaveEvery = 20 * time.Millisecond })
	w, err := one.Watch(t.Context(), Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_finished"})
	if err != nil {
		t.Fatal(err)
	}
	rewriteWatch(t, one, w.ID, func(have *Watch) {
		have.Driver, have.State, have.Answer, have.UpdatedAt = "two", WatchCompleted, "done by two", time.Now().UTC()
	})
	testutil.WaitForWhat(t, 15*time.Second, "replica one to step aside from the watch two finished", func() bool { return !one.driving(w.ID) })
	if after, _ := storedWatch(t, one, w.ID); after.State != WatchCompleted || after.Answer != "done by two" {
		t.Fatalf("after stepping aside the record says %s %q; want two's completed answer", after.State, after.Answer)
	}
}

// endingPlatform reports its objects running until end is called, then done.
type endingPlatform struct {
	idlePlatform
	ended atomic.Bool
}

func (p *endingPlatform) Poll(context.Context, Ref) (*Observation, error) {
	if p.ended.Load() {
		return &Observation{State: ObjectDone, Answer: "done"}, nil
	}
	return &Observation{State: ObjectRunning}, nil
}

// A driver that has not yet noticed its watch was taken, and sees the
// object end, leaves the record to the replica that took it: it used to
// write its outcome with a plain put, naming itself the driver again.
func TestAStaleDriverDoesNotWriteOverTheWatchItLost(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &endingPlatform{}
	one := replicaOn(t, js, "one", p, func(d *Dispatcher) { d.watchSaveEvery = time.Hour }) // it notices the claim only by its own save
	w, err := one.Watch(t.Context(), Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_lost"})
	if err != nil {
		t.Fatal(err)
	}
	rewriteWatch(t, one, w.ID, func(have *Watch) { have.Driver, have.UpdatedAt = "two", time.Now().UTC() })
	p.ended.Store(true)
	testutil.WaitForWhat(t, 15*time.Second, "replica one to step aside from the watch two took", func() bool { return !one.driving(w.ID) })
	if after, _ := storedWatch(t, one, w.ID); after.Driver != "two" || after.State != WatchActive {
		t.Fatalf("the record says driver %q, state %s; want two's, still active", after.Driver, after.State)
	}
}

// A lease past its expiry here, with no renewal heard and no marker from
// the server yet (a watcher stalled while a server fails over), has
// lapsed lately for one lease period, then not any more; a current lease
// has not lapsed.
func TestALeasePastItsExpiryHasLapsedLately(t *testing.T) {
	r := newRegistry(testutil.Logger(t))
	lease := func(team string, expired time.Duration) {
		r.live["get_weather"] = map[string]*declared{"k": {expires: time.Now().Add(-expired),
			decl: &protocol.Declaration{Spec: protocol.FunctionSpec{Name: "get_weather", Team: team}}}}
	}
	for _, c := range []struct {
		team    string
		expired time.Duration
		want    bool
	}{
		{"geo", -time.Second, false},
		{"geo", time.Second, true},
		{"geo", protocol.LeaseTTL + time.Second, false},
		{"other", time.Second, false},
	} {
		lease(c.team, c.expired)
		if got := r.lapsedLately("get_weather", "geo"); got != c.want {
			t.Errorf("a lease of team %s expired %s ago: lapsed lately = %v, want %v", c.team, c.expired, got, c.want)
		}
	}
}
