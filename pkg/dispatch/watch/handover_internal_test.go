package watch

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// replica starts a dispatcher named name on js with its watch driver, on a
// platform whose responses never finish, so its watches stay active.
func replica(t testing.TB, js jetstream.JetStream, name string) *Service {
	t.Helper()
	return replicaOn(t, js, name, idlePlatform{})
}

// replicaOn is replica on platform p, with tune applied to its driver
// before it runs.
func replicaOn(t testing.TB, js jetstream.JetStream, name string, p dispatch.Platform, tune ...func(*Service)) *Service {
	t.Helper()
	d, err := dispatch.New(js, []dispatch.Platform{p}, dispatch.Options{Name: name, Logger: testutil.Logger(t), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s := New(d, js)
	for _, f := range tune {
		f(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 30*time.Second, "replica "+name+" to be ready", d.Ready)
	return s
}

// idlePlatform is a Responses platform whose responses are always still
// running.
type idlePlatform struct{}

func (idlePlatform) Name() protocol.Platform { return protocol.PlatformResponses }
func (idlePlatform) Poll(context.Context, dispatch.Ref) (*dispatch.Observation, error) {
	return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
}
func (idlePlatform) Submit(context.Context, *dispatch.Turn, []dispatch.Output) (*dispatch.Submission, error) {
	return &dispatch.Submission{}, nil
}

// rewriteWatch changes the stored watch as another replica would: by
// compare-and-set, read again when the driver saved it meanwhile (it may
// save every few milliseconds here).
func rewriteWatch(t *testing.T, s *Service, id string, change func(*dispatch.Watch)) {
	t.Helper()
	testutil.WaitForWhat(t, 10*time.Second, "the watch to be rewritten", func() bool {
		have, rev := storedWatch(t, s, id)
		change(have)
		b, _ := json.Marshal(have)
		_, err := s.buckets.Load().watches.Update(t.Context(), id, b, rev)
		if err != nil && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			t.Fatal(err)
		}
		return err == nil
	})
}

func storedWatch(t *testing.T, s *Service, id string) (*dispatch.Watch, uint64) {
	t.Helper()
	e, err := s.buckets.Load().watches.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var w dispatch.Watch
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
	w, err := one.Watch(t.Context(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_driven"})
	if err != nil {
		t.Fatal(err)
	}
	two := replica(t, js, "two")
	two.Sweep(t.Context(), true)
	if two.drives(w.ID) {
		t.Fatal("the starting replica took a watch that a running replica drives")
	}
	if have, _ := storedWatch(t, two, w.ID); have.Driver != "one" || !one.drives(w.ID) {
		t.Fatalf("watch driver %q (one driving: %v), want still one", have.Driver, one.drives(w.ID))
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
	now := time.Now().UTC().Add(-(saveEvery + presenceGrace + time.Second))
	orphan := &dispatch.Watch{ID: watchID(dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_orphan"}),
		Ref: dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_orphan"}, State: dispatch.WatchActive,
		CreatedAt: now, UpdatedAt: now, Driver: "killed"}
	orphan.Current = orphan.Ref
	b, _ := json.Marshal(orphan)
	if _, err := two.buckets.Load().watches.Create(t.Context(), orphan.ID, b); err != nil {
		t.Fatal(err)
	}
	two.Sweep(t.Context(), false)
	// Taken: the replica's own sweep may be the one that takes it, and be
	// starting the driver as this one returns.
	testutil.WaitForWhat(t, 5*time.Second, "replica two to drive the orphaned watch", func() bool { return two.drives(orphan.ID) })
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
	one := replicaOn(t, js, "one", idlePlatform{}, func(s *Service) { s.saveEvery = 20 * time.Millisecond })
	w, err := one.Watch(t.Context(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_taken"})
	if err != nil {
		t.Fatal(err)
	}
	rewriteWatch(t, one, w.ID, func(have *dispatch.Watch) { have.Driver, have.UpdatedAt = "two", time.Now().UTC() })
	testutil.WaitForWhat(t, 15*time.Second, "replica one to step aside from the watch two took", func() bool { return !one.drives(w.ID) })
	if after, _ := storedWatch(t, one, w.ID); after.Driver != "two" || after.Released || after.State != dispatch.WatchActive {
		t.Fatalf("after stepping aside the record says driver %q, released %v, state %s; want two's, not released, active", after.Driver, after.Released, after.State)
	}
}

// A driver whose watch another replica finished steps aside too, and its
// keep-alive does not write its stale copy back over the outcome.
func TestADriverLeavesAWatchAnotherReplicaFinished(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	one := replicaOn(t, js, "one", idlePlatform{}, func(s *Service) { s.saveEvery = 20 * time.Millisecond })
	w, err := one.Watch(t.Context(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_finished"})
	if err != nil {
		t.Fatal(err)
	}
	rewriteWatch(t, one, w.ID, func(have *dispatch.Watch) {
		have.Driver, have.State, have.Answer, have.UpdatedAt = "two", dispatch.WatchCompleted, "done by two", time.Now().UTC()
	})
	testutil.WaitForWhat(t, 15*time.Second, "replica one to step aside from the watch two finished", func() bool { return !one.drives(w.ID) })
	if after, _ := storedWatch(t, one, w.ID); after.State != dispatch.WatchCompleted || after.Answer != "done by two" {
		t.Fatalf("after stepping aside the record says %s %q; want two's completed answer", after.State, after.Answer)
	}
}

// endingPlatform reports its objects running until end is called, then done.
type endingPlatform struct {
	idlePlatform
	ended atomic.Bool
}

func (p *endingPlatform) Poll(context.Context, dispatch.Ref) (*dispatch.Observation, error) {
	if p.ended.Load() {
		return &dispatch.Observation{State: dispatch.ObjectDone, Answer: "done"}, nil
	}
	return &dispatch.Observation{State: dispatch.ObjectRunning}, nil
}

// A driver that has not yet noticed its watch was taken, and sees the
// object end, leaves the record to the replica that took it: it used to
// write its outcome with a plain put, naming itself the driver again.
func TestAStaleDriverDoesNotWriteOverTheWatchItLost(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &endingPlatform{}
	one := replicaOn(t, js, "one", p, func(s *Service) { s.saveEvery = time.Hour }) // it notices the claim only by its own save
	w, err := one.Watch(t.Context(), dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_lost"})
	if err != nil {
		t.Fatal(err)
	}
	rewriteWatch(t, one, w.ID, func(have *dispatch.Watch) { have.Driver, have.UpdatedAt = "two", time.Now().UTC() })
	p.ended.Store(true)
	testutil.WaitForWhat(t, 15*time.Second, "replica one to step aside from the watch two took", func() bool { return !one.drives(w.ID) })
	if after, _ := storedWatch(t, one, w.ID); after.Driver != "two" || after.State != dispatch.WatchActive {
		t.Fatalf("the record says driver %q, state %s; want two's, still active", after.Driver, after.State)
	}
}

// With JetStream gone, a watch request (POST /v1/watch) is answered 503
// once the wait for a failover is over, not 500: the caller's retry will
// succeed.
func TestWatchAnswers503WhileJetStreamIsAway(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	s := replicaOn(t, js, "one", idlePlatform{}, func(s *Service) { s.unavailableFor = 500 * time.Millisecond })

	srv.Shutdown()
	srv.WaitForShutdown()
	status, reply := s.d.AnswerWatchRequest(t.Context(), []byte(`{"platform":"responses","response_id":"resp_away"}`))
	body, _ := json.Marshal(reply)
	if status != http.StatusServiceUnavailable {
		t.Fatalf("watch request with JetStream away: %d %s; want 503", status, body)
	}
	if !strings.Contains(string(body), "unavailable") {
		t.Errorf("body %s does not say JetStream is unavailable", body)
	}
}

// A driver waiting for its turn to close keeps saving its watch, and stops
// waiting once another replica took the watch.
func TestAWaitingDriverStepsAsideWhenItsWatchIsTaken(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	s := replicaOn(t, js, "one", idlePlatform{}, func(s *Service) { s.saveEvery = 20 * time.Millisecond })
	ref := dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_waiting"}
	created := time.Now().UTC()
	w := &dispatch.Watch{ID: watchID(ref), Ref: ref, Current: ref, State: dispatch.WatchActive, CreatedAt: created, UpdatedAt: created, Driver: "one"}
	b, _ := json.Marshal(w)
	if _, err := s.buckets.Load().watches.Create(t.Context(), w.ID, b); err != nil {
		t.Fatal(err)
	}
	lastSave := created
	got := make(chan error, 1)
	go func() {
		// A turn never recorded: it never closes.
		_, _, err := s.awaitClosed(t.Context(), "0123456789abcdef0123456789abcdef", w, &lastSave)
		got <- err
	}()
	testutil.WaitForWhat(t, 10*time.Second, "the waiting driver to save its watch", func() bool {
		have, _ := storedWatch(t, s, w.ID)
		return have.UpdatedAt.After(created)
	})
	rewriteWatch(t, s, w.ID, func(have *dispatch.Watch) { have.Driver, have.UpdatedAt = "two", time.Now().UTC() })
	select {
	case err := <-got:
		if !errors.Is(err, errHandedOver) {
			t.Fatalf("the wait ended with %v; want errHandedOver", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the driver went on waiting for a watch another replica took")
	}
	if after, _ := storedWatch(t, s, w.ID); after.Driver != "two" {
		t.Fatalf("the record names driver %q; want two's claim to stand", after.Driver)
	}
}
