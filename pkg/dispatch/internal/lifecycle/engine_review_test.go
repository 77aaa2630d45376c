package lifecycle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"
)

// reviewEnv is a minimal Env: one in-memory store, a fixed clock, every
// goroutine given ctx (cancelled: the process is stopping, as the
// dispatcher's background context is once Run's context ends and it
// releases its leases).
type reviewEnv struct {
	ctx     context.Context
	now     time.Time
	mu      sync.Mutex
	store   map[string]*Rec
	rev     uint64
	submits int
	tells   []string // "owner key" of each Tell; owner "" means any
	wg      sync.WaitGroup
}

func (e *reviewEnv) Now() time.Time { return e.now }
func (e *reviewEnv) Go(f func(context.Context)) {
	e.wg.Add(1)
	go func() { defer e.wg.Done(); f(e.ctx) }()
}
func (e *reviewEnv) After(time.Duration, func()) func() bool { return func() bool { return true } }
func (e *reviewEnv) Sleep(ctx context.Context, d time.Duration) bool {
	return ctx.Err() == nil
}
func (e *reviewEnv) Cached(string) *Rec { return nil }
func (e *reviewEnv) Load(_ context.Context, key string) (*Rec, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if r := e.store[key]; r != nil {
		return r.Clone(), nil
	}
	return nil, ErrNotFound
}

// Write stores even when ctx is done, as turnEnv.Write does (a write of a
// stopping process is made all the same, for releaseTimeout).
func (e *reviewEnv) Write(_ context.Context, r *Rec) (uint64, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if cur := e.store[r.Key]; cur == nil || cur.Rev != r.Rev {
		return 0, ErrConflict
	}
	e.rev++
	s := r.Clone()
	s.Rev = e.rev
	e.store[r.Key] = s
	return e.rev, nil
}
func (e *reviewEnv) Complete(context.Context, *Rec) (bool, error)    { return true, nil }
func (e *reviewEnv) Missing(context.Context, *Rec) ([]string, error) { return nil, nil }
func (e *reviewEnv) Prepare(context.Context, *Rec) error             { return nil }
func (e *reviewEnv) Submit(context.Context, *Rec, func() bool) (any, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.submits++
	return "next", nil
}
func (e *reviewEnv) Tell(owner, key string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tells = append(e.tells, owner+" "+key)
}
func (e *reviewEnv) Closed(*Rec, bool) {}

func (e *reviewEnv) stored(key string) *Rec {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.store[key].Clone()
}

func stoppingEngine(t *testing.T, r *Rec) (*Engine, *reviewEnv) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // stopping
	env := &reviewEnv{ctx: ctx, now: simStart, store: map[string]*Rec{}}
	env.rev = 10
	r.Rev = env.rev
	env.store[r.Key] = r
	return New("me", env, nil), env
}

// Found by review, failing before its fix: a stopping process (its context done) that gets an event of a
// turn after it released the turn's lease — a tell from another replica
// (serveTells runs until after releaseAll), a deadline timer (the timers'
// consumer is stopped only after releaseAll: dispatcher.go's defers), a
// re-check or a wake-up armed before — takes the lease back (epoch up,
// state submitting), then submits nothing (submit's loop does not start
// with ctx done). The turn is kept from the other replicas for
// LeaseFor+Skew (17 s) by a process that is gone: a clean stop costs what
// a kill -9 costs, against docs/turns.md ("the others take those turns at
// once"), and it uses up the submit margin's one owner failure.
func TestEngineStoppingEngineDoesNotRetakeReleasedLease(t *testing.T) {
	for _, c := range []struct {
		name string
		send func(e *Engine, key string)
	}{
		{"deadline timer after release", func(e *Engine, key string) { e.Due(key) }},
		{"tell after release", func(e *Engine, key string) { e.Close(key) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			due := c.name == "deadline timer after release"
			deadline := simStart.Add(time.Minute)
			if due {
				deadline = simStart.Add(-time.Second)
			}
			// As the release left it: collecting, the lease given up.
			e, env := stoppingEngine(t, &Rec{Key: "t1", State: Collecting, Deadline: deadline, Lease: Lease{Epoch: 1}})
			c.send(e, "t1")
			env.wg.Wait()
			r := env.stored("t1")
			if r.Lease.Owner == "me" {
				t.Errorf("a stopping process took the lease back after releasing it: record %s, lease %s, %d submissions; "+
					"the others must wait until %s", r.State, r.Lease, env.submits, r.Lease.Until.Add(Skew).Sub(simStart))
			}
		})
	}
}

// Found by review, failing before its fix: the same, in one engine's own queue: Release then an event that
// was on its way (the Release is not the last event of the turn).
func TestEngineReleaseThenQueuedEventLeavesLeaseFree(t *testing.T) {
	e, env := stoppingEngine(t, &Rec{Key: "t1", State: Collecting, Deadline: simStart.Add(time.Minute),
		Lease: Lease{Owner: "me", Until: simStart.Add(10 * time.Second), Epoch: 1}})
	e.Release(func() []string { return []string{"t1"} })
	e.Close("t1")
	env.wg.Wait()
	if r := env.stored("t1"); r.Lease.Owner != "" {
		t.Errorf("after Release and a later event, the stopping process holds %s (record %s), %d submissions", r.Lease, r.State, env.submits)
	}
}

// Found by CI (TestAWatchTakenOverMidIntakeSendsItsCalls), failing before
// its fix: a stopping process gave its leases up and told nobody, and
// dropped the news of a turn that came to it meanwhile; a replica that had
// looked at the lease before the release waited for it to lapse (17 s),
// and a turn whose results were all in waited for the sweep. Now the turn
// is handed on: released and any other process told, or its owner told.
func TestEngineStoppingProcessHandsTurnsOn(t *testing.T) {
	for _, c := range []struct {
		name  string
		lease Lease
		send  func(e *Engine, key string)
		tell  string
	}{
		{"its own lease released", Lease{Owner: "me", Until: simStart.Add(10 * time.Second), Epoch: 1},
			func(e *Engine, key string) { e.Release(func() []string { return []string{key} }) }, " t1"},
		{"news of a turn another owns", Lease{Owner: "other", Until: simStart.Add(10 * time.Second), Epoch: 1},
			func(e *Engine, key string) { e.Close(key) }, "other t1"},
		{"news of a turn whose owner's lease lapsed", Lease{Owner: "gone", Until: simStart.Add(-LeaseFor), Epoch: 1},
			func(e *Engine, key string) { e.Close(key) }, " t1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e, env := stoppingEngine(t, &Rec{Key: "t1", State: Collecting, Deadline: simStart.Add(time.Minute), Lease: c.lease})
			e.Release(nil)
			c.send(e, "t1")
			env.wg.Wait()
			r := env.stored("t1")
			if c.lease.Owner == "me" && r.Lease.Owner != "" {
				t.Errorf("the stopping process still holds %s", r.Lease)
			}
			if len(env.tells) == 0 || env.tells[0] != c.tell || env.submits != 0 {
				t.Errorf("tells %q and %d submissions, want the first tell %q and none", env.tells, env.submits, c.tell)
			}
		})
	}
}

// flakyEnv is reviewEnv whose writes can be made to go unanswered (not
// stored), as JetStream does in a leader election.
type flakyEnv struct {
	reviewEnv
	fail bool
}

func (e *flakyEnv) Write(ctx context.Context, r *Rec) (uint64, error) {
	e.mu.Lock()
	fail := e.fail
	e.mu.Unlock()
	if fail {
		return 0, context.DeadlineExceeded // may or may not be stored: here, not
	}
	return e.reviewEnv.Write(ctx, r)
}

func (e *flakyEnv) setFail(v bool) {
	e.mu.Lock()
	e.fail = v
	e.mu.Unlock()
}

// Found by review, failing before its fix: the owner submits a turn whose results are all in (the direct
// path: no write before, the record stays collecting); the platform takes
// it; recording the outcome fails for a while (finish keeps it in
// t.ended, "recorded, not submitted again, by the next event"). The next
// event is a cancellation (the watch's run ended, an MCP client cancels):
// cancel() never looks at t.ended, sees the stale record still
// collecting under its own lease, and writes the turn failed ("not
// submitted: ...") and answers true, so cancelTurn tells the executors
// to cancel: a turn the platform took is recorded as never submitted.
func TestEngineCancelAfterUnrecordedSubmissionKeepsTheSubmission(t *testing.T) {
	env := &flakyEnv{reviewEnv: reviewEnv{ctx: context.Background(), now: simStart, store: map[string]*Rec{}, rev: 10}}
	env.store["t1"] = &Rec{Key: "t1", State: Collecting, Deadline: simStart.Add(time.Minute), Rev: 10,
		Lease: Lease{Owner: "me", Until: simStart.Add(LeaseFor), Epoch: 1}}
	e := New("me", env, nil)
	// Writes fail from the submission on: the platform takes the turn and
	// its outcome cannot be recorded.
	env.reviewEnv.mu.Lock()
	env.reviewEnv.submits = 0
	env.reviewEnv.mu.Unlock()
	sub := &submitHook{flakyEnv: env}
	e.env = sub
	e.Close("t1")
	env.wg.Wait()
	if env.submits != 1 {
		t.Fatalf("%d submissions, want 1", env.submits)
	}
	env.setFail(false) // the store answers again
	var cancelled bool
	e.Cancel("t1", "not submitted: run cancelled", func(ok bool) { cancelled = ok })
	env.wg.Wait()
	r := env.stored("t1")
	if r.State != Submitted || cancelled {
		t.Errorf("the platform took the turn, then a cancellation recorded it %s (%q) and reported cancelled=%v",
			r.State, r.Error, cancelled)
	}
}

// submitHook makes writes fail once the submission was made.
type submitHook struct{ *flakyEnv }

func (h *submitHook) Submit(ctx context.Context, r *Rec, keep func() bool) (any, error) {
	out, err := h.flakyEnv.Submit(ctx, r, keep)
	h.setFail(true)
	return out, err
}

// Found by review, failing before its fix: the simulation never injects a cancellation (Engine.Cancel),
// which production sends (driver.go cancelTurn: a run the platform ended,
// an MCP client's cancel). With cancellations injected, a turn the
// platform received ends recorded as cancelled, "not submitted".
func TestEngineSimulationWithCancels(t *testing.T) {
	// Seeds 18400..18450 by default (18419: the owner killed after the
	// platform took the turn, the cancellation recorded it "not
	// submitted"); -seed N replays one with a trace (-v).
	from, to := uint64(18400), uint64(18450)
	if *simSeed != 0 {
		from, to = *simSeed, *simSeed
	}
	for seed := from; seed <= to; seed++ {
		r := simulate(seed, simConfig{procs: 3, turns: 6, cancels: true}, testing.Verbose())
		if len(r.violations) > 0 {
			msg := strings.Join(r.violations, "\n")
			if testing.Verbose() {
				msg += "\n\ntrace:\n" + strings.Join(r.trace, "\n")
			}
			t.Fatalf("seed %d (cancellations injected):\n%s", seed, msg)
		}
	}
}

// stopMidSubmission is a platform that is still answering when its
// process is told to stop: Submit moves the clock on until the lease needs
// renewing, releases the process's leases (SIGTERM), and asks keep.
type stopMidSubmission struct {
	*reviewEnv
	e    *Engine
	kept bool
}

func (s *stopMidSubmission) Submit(ctx context.Context, r *Rec, keep func() bool) (any, error) {
	s.mu.Lock()
	s.now = r.Lease.Until.Add(-time.Second)
	s.mu.Unlock()
	s.e.Release(nil)
	s.kept = keep()
	return s.reviewEnv.Submit(ctx, r, keep)
}

func (s *stopMidSubmission) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

// Found by review, failing before its fix: a process told to stop while
// the platform had not yet answered its submission stopped renewing the
// lease, so the attempt was cut off (keep false) and the turn handed to
// another process, which sent it again: on Responses chained by
// previous_response_id alone, a second continuation. The submission
// under way now keeps its lease and ends within the stop's wait.
func TestEngineStopDoesNotCutOffASubmissionUnderWay(t *testing.T) {
	env := &reviewEnv{ctx: context.Background(), now: simStart, store: map[string]*Rec{}, rev: 10}
	env.store["t1"] = &Rec{Key: "t1", State: Collecting, Deadline: simStart.Add(time.Minute), Rev: 10,
		Lease: Lease{Owner: "me", Until: simStart.Add(LeaseFor), Epoch: 1}}
	s := &stopMidSubmission{reviewEnv: env}
	s.e = New("me", s, nil)
	s.e.Close("t1")
	env.wg.Wait()
	r := env.stored("t1")
	if !s.kept || r.State != Submitted || env.submits != 1 {
		t.Errorf("stopped mid-submission: keep = %v, record %s (lease %s), %d submissions; want the attempt kept and the turn submitted once",
			s.kept, r.State, r.Lease, env.submits)
	}
}

// takenBetweenAttempts is a platform whose first attempt fails for a
// retry after the lease lapsed, and another process took the turn over.
type takenBetweenAttempts struct{ *reviewEnv }

func (s *takenBetweenAttempts) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now
}

func (s *takenBetweenAttempts) Submit(context.Context, *Rec, func() bool) (any, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.submits++
	r := s.store["t1"].Clone()
	s.now = r.Lease.Until.Add(Skew + time.Second) // the lease lapsed while the platform answered
	s.rev++
	r.Rev, r.Lease = s.rev, Lease{Owner: "other", Until: s.now.Add(LeaseFor), Epoch: r.Lease.Epoch + 1}
	s.store["t1"] = r
	return nil, &RetryError{Wait: time.Millisecond, Err: errors.New("429")}
}

// Found by review, failing before its fix: a process whose retry found
// the turn taken over kept its record in memory for good (an attempt
// marked sent, never ended here), one per such turn.
func TestEngineForgetsATurnTakenOverBetweenAttempts(t *testing.T) {
	env := &reviewEnv{ctx: context.Background(), now: simStart, store: map[string]*Rec{}, rev: 10}
	env.store["t1"] = &Rec{Key: "t1", State: Collecting, Deadline: simStart.Add(time.Minute), Rev: 10,
		Lease: Lease{Owner: "me", Until: simStart.Add(LeaseFor), Epoch: 1}}
	e := New("me", &takenBetweenAttempts{env}, nil)
	e.Close("t1")
	env.wg.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, kept := e.turns["t1"]; kept || env.submits != 1 {
		t.Errorf("after the turn was taken over between attempts: kept in memory %v, %d submissions; want forgotten after one", kept, env.submits)
	}
}

// Found by review: the turns a stopping process gathers for were listed
// before it was stopping, so a turn whose intake tracked it in between,
// and then read Stopping as false, was neither released nor released by
// its intake: its lease lapsed 17 s later. Release now lists them once
// the process is stopping, and an intake either is in the list or sees
// Stopping (and releases its turn itself).
func TestReleaseListsTheTurnsOnceStopping(t *testing.T) {
	env := &reviewEnv{ctx: context.Background(), now: simStart, store: map[string]*Rec{}}
	e := New("me", env, nil)
	var stoppingWhenListed bool
	e.Release(func() []string { stoppingWhenListed = e.Stopping(); return nil })
	if !stoppingWhenListed {
		t.Error("Release listed the turns it gathers for before the engine was stopping")
	}
}
