package dispatch

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// limitedPlatform refuses the first refusals submissions with a 429 whose
// Retry-After is longer than any run has left.
type limitedPlatform struct {
	idlePlatform
	mu       sync.Mutex
	refusals int
	attempts int
}

func (p *limitedPlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts++
	if p.attempts <= p.refusals {
		return nil, &PlatformError{Op: "submit", StatusCode: http.StatusTooManyRequests, Retryable: true,
			RetryAfter: time.Hour, Err: errors.New("429 Rate limit reached")}
	}
	return &Submission{}, nil
}

// A submission whose next retry would come after the run expires makes one
// last attempt just before it does, instead of giving up with seconds
// left: the soak saw a run expire so, its platform rate-limiting for a
// while and answering again in time.
func TestASubmissionTriesOnceMoreBeforeTheRunExpires(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &limitedPlatform{refusals: 1}
	d, err := New(js, []Platform{p}, Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	turn := &Turn{Key: "t", Ref: Ref{Platform: p.Name()}, ExpiresAt: time.Now().Add(3 * time.Second)}
	if _, err := d.submitWithRetry(t.Context(), turn, nil); err != nil {
		t.Fatalf("submission: %v after %d attempts; want the last attempt before expiry to go through", err, p.attempts)
	}
	if p.attempts != 2 {
		t.Fatalf("%d attempts, want 2 (the second just before expiry)", p.attempts)
	}

	// With no time left for another, it gives up and says so.
	p.attempts, p.refusals = 0, 10
	turn.ExpiresAt = time.Now().Add(lastAttemptLead / 2)
	if _, err := d.submitWithRetry(t.Context(), turn, nil); err == nil || p.attempts != 1 {
		t.Fatalf("submission with no time left: %v after %d attempts; want one attempt, then an error", err, p.attempts)
	}
}

// The waits between submission attempts shrink as the run's expiry nears,
// the platform's Retry-After stands, and the last attempt goes out just
// before expiry.
func TestRetryWaitsShrinkAsExpiryNears(t *testing.T) {
	for _, c := range []struct {
		name                      string
		left, backoff, retryAfter time.Duration
		want                      time.Duration
		ok                        bool
	}{
		{"early: the backoff", time.Minute, 2 * time.Second, 0, 2 * time.Second, true},
		{"late: a quarter of what is left", 11 * time.Second, 6300 * time.Millisecond, 0, 2750 * time.Millisecond, true},
		{"Retry-After stands", 10 * time.Second, 6 * time.Second, 4 * time.Second, 4 * time.Second, true},
		{"a Retry-After past expiry: one last attempt", 3 * time.Second, time.Second, time.Hour, 3*time.Second - lastAttemptLead, true},
		{"no time for another", lastAttemptLead / 2, time.Second, 0, 0, false},
	} {
		got, ok := retryWait(c.left, c.backoff, c.retryAfter)
		if got != c.want || ok != c.ok {
			t.Errorf("%s: retryWait(%s, %s, %s) = %s, %v; want %s, %v", c.name, c.left, c.backoff, c.retryAfter, got, ok, c.want, c.ok)
		}
	}
}

// refusingPlatform answers every submission 429 until accept is called,
// counting the attempts.
type refusingPlatform struct {
	idlePlatform
	mu       sync.Mutex
	accepted bool
	attempts int
}

func (p *refusingPlatform) Submit(context.Context, *Turn, []Output) (*Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts++
	if p.accepted {
		return &Submission{}, nil
	}
	return nil, &PlatformError{Op: "submit", StatusCode: http.StatusTooManyRequests, Retryable: true, Err: errors.New("429 Rate limit reached")}
}

func (p *refusingPlatform) accept() {
	p.mu.Lock()
	p.accepted = true
	p.mu.Unlock()
}

// submittingTurn records a turn that replica d submits, as closeTurn
// leaves it, and returns it with its revision.
func submittingTurn(t *testing.T, d *Dispatcher, key protocol.TurnKey, expires time.Time) (*Turn, uint64) {
	t.Helper()
	turn := &Turn{Version: 1, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_" + string(key)},
		State: TurnSubmitting, out: &TurnOutcome{Owner: d.opts.Name, SubmittingSince: time.Now().UTC()},
		CreatedAt: time.Now().UTC(), ExpiresAt: expires, Deadline: expires.Add(-time.Second)}
	rev, err := d.turns.create(t.Context(), turn)
	if err != nil {
		t.Fatal(err)
	}
	return turn, rev
}

// fastRenewals makes a replica renew its claims every 20 ms.
func fastRenewals(d *Dispatcher) { d.claimRenewEvery = 20 * time.Millisecond }

// awaitDone waits for a submission run in the background to return.
func awaitDone(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal(what)
	}
}

// A submission the platform keeps refusing renews its claim while it is
// retried, so the sweep of another replica does not take it over as stuck
// (two replicas then retried the same turn side by side).
func TestARetriedSubmissionKeepsItsClaim(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &refusingPlatform{}
	one := replicaOn(t, js, "one", p, fastRenewals)
	turn, rev := submittingTurn(t, one, "0123456789abcdef0123456789abcdef", time.Now().Add(time.Minute))
	since := turn.Outcome().SubmittingSince
	done := make(chan struct{})
	go func() { defer close(done); one.submit(context.Background(), turn, rev) }()

	testutil.WaitFor(t, 10*time.Second, func() bool {
		have, _, err := one.turns.get(t.Context(), turn.Key)
		return err == nil && have.Outcome().SubmittingSince.After(since.Add(50*time.Millisecond))
	})
	p.accept()
	awaitDone(t, done, "the submission did not end once the platform accepted it")
	have, _, err := one.turns.get(t.Context(), turn.Key)
	if err != nil {
		t.Fatal(err)
	}
	if have.State != TurnSubmitted || have.Outcome().Owner != "one" {
		t.Fatalf("after the retries the record is %s, owner %q; want submitted by one", have.State, have.Outcome().Owner)
	}
}

// A submission whose claim was taken over stops retrying at its next
// renewal and leaves the outcome to the taker: another replica, or this
// one's own sweep or a restart of it by the same name (a claim written at
// another instant is not this submission's).
func TestASubmissionTakenOverStopsRetrying(t *testing.T) {
	for _, taker := range []string{"two", "one"} {
		t.Run("by "+taker, func(t *testing.T) {
			_, js := natstest.Start(t).Connect(t)
			p := &refusingPlatform{}
			one := replicaOn(t, js, "one", p, fastRenewals)
			turn, rev := submittingTurn(t, one, "fedcba9876543210fedcba9876543210", time.Now().Add(time.Minute))
			done := make(chan struct{})
			go func() { defer close(done); one.submit(context.Background(), turn, rev) }()
			testutil.WaitFor(t, 10*time.Second, func() bool { p.mu.Lock(); defer p.mu.Unlock(); return p.attempts > 0 })

			var claimed time.Time
			for { // the submission renews meanwhile: take it at the revision read
				have, haveRev, err := one.turns.get(t.Context(), turn.Key)
				if err != nil {
					t.Fatal(err)
				}
				claim := have.writeOutcome()
				claim.Owner, claim.SubmittingSince = taker, time.Now().UTC().Add(time.Hour)
				if _, err = one.turns.update(t.Context(), have, haveRev); err == nil {
					claimed = claim.SubmittingSince
					break
				}
			}
			awaitDone(t, done, "the submission went on retrying after it was taken over")
			after, _, err := one.turns.get(t.Context(), turn.Key)
			if err != nil {
				t.Fatal(err)
			}
			if after.State != TurnSubmitting || after.Outcome().Owner != taker || !after.Outcome().SubmittingSince.Equal(claimed) {
				t.Fatalf("the record is %s, owner %q since %s; want still submitting, the taker's claim", after.State, after.Outcome().Owner, after.Outcome().SubmittingSince)
			}
		})
	}
}

// The sweep does not take over a turn this process is submitting, however
// old its claim looks: before, a replica's own sweep took over its
// retries after 15 s, and two of its goroutines submitted side by side.
func TestTheSweepLeavesATurnSubmittedHere(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	one := replicaOn(t, js, "one", idlePlatform{})
	turn, rev := submittingTurn(t, one, "00112233445566778899aabbccddeeff", time.Now().Add(time.Minute))
	turn.writeOutcome().SubmittingSince = time.Now().UTC().Add(-2 * stuckAfter)
	rev, err := one.turns.update(t.Context(), turn, rev)
	if err != nil {
		t.Fatal(err)
	}
	done, ok := one.submittingHere(turn.Key)
	if !ok {
		t.Fatal("submittingHere: already marked")
	}
	defer done()
	if _, again := one.submittingHere(turn.Key); again {
		t.Fatal("a second submission of the same turn was let through")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	one.takeOver(ctx, turn.Key)
	if _, after, err := one.turns.get(t.Context(), turn.Key); err != nil || after != rev {
		t.Fatalf("after the sweep's take-over the record is at revision %d (%v); want it untouched at %d", after, err, rev)
	}
}

// expiringRefuser refuses every submission as retryable, noting each
// attempt's deadline, and calls onRefuse (if set) after each refusal.
type expiringRefuser struct {
	idlePlatform
	deadlines []time.Time
	onRefuse  func()
}

func (p *expiringRefuser) Submit(ctx context.Context, _ *Turn, _ []Output) (*Submission, error) {
	dl, _ := ctx.Deadline()
	p.deadlines = append(p.deadlines, dl)
	if p.onRefuse != nil {
		p.onRefuse()
	}
	return nil, &PlatformError{Op: "submit", StatusCode: http.StatusBadGateway, Retryable: true, Err: errors.New("bad gateway")}
}

// Every attempt ends by the run's expiry (and by its own timeout), with one
// context per attempt; a takeover during the wait between attempts still
// ends the submission as taken over.
func TestSubmissionAttemptsEndByTheRunsExpiry(t *testing.T) {
	_, js := natstest.Start(t).Connect(t)
	p := &expiringRefuser{}
	d, err := New(js, []Platform{p}, Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	soon := &Turn{Key: "t", Ref: Ref{Platform: p.Name()}, ExpiresAt: time.Now().Add(1500 * time.Millisecond)}
	if _, err := d.submitWithRetry(t.Context(), soon, nil); err == nil {
		t.Fatal("a submission refused until the run expired succeeded")
	}
	for i, dl := range p.deadlines {
		if dl.IsZero() || dl.After(soon.ExpiresAt) {
			t.Fatalf("attempt %d's deadline %v, want by the run's expiry %v", i+1, dl, soon.ExpiresAt)
		}
	}

	ctx, cancel := context.WithCancelCause(t.Context())
	defer cancel(nil)
	p.deadlines = nil
	p.onRefuse = func() { cancel(errTakenOver) } // taken over as the first attempt is refused
	later := &Turn{Key: "t", Ref: Ref{Platform: p.Name()}, ExpiresAt: time.Now().Add(time.Hour)}
	if _, err := d.submitWithRetry(ctx, later, nil); !errors.Is(err, errTakenOver) {
		t.Fatalf("err %v, want errTakenOver", err)
	}
	if len(p.deadlines) != 1 || time.Until(p.deadlines[0]) > submitAttemptTimeout {
		t.Fatalf("attempts' deadlines %v, want one within %s", p.deadlines, submitAttemptTimeout)
	}
}
