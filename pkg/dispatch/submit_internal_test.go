package dispatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
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
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &limitedPlatform{refusals: 1}
	d := replicaOn(t, js, "one", p)
	turn := submitHere(t, d, "0123456789abcdef0123456789abcdef", time.Now().Add(3*time.Second))
	if turn.State != TurnSubmitted {
		t.Fatalf("submission: %s (%s) after %d attempts; want the last attempt before expiry to go through", turn.State, turn.Outcome().Error, p.attempts)
	}
	if p.attempts != 2 {
		t.Fatalf("%d attempts, want 2 (the second just before expiry)", p.attempts)
	}

	// With no time left for another, it gives up and says so.
	p.mu.Lock()
	p.attempts, p.refusals = 0, 10
	p.mu.Unlock()
	turn = submitHere(t, d, "fedcba9876543210fedcba9876543210", time.Now().Add(lastAttemptLead/2))
	if turn.State != TurnFailed || p.attempts != 1 || !strings.Contains(turn.Outcome().Error, "gave up after 1 attempts") {
		t.Fatalf("submission with no time left: %s (%q) after %d attempts; want one attempt, then failed", turn.State, turn.Outcome().Error, p.attempts)
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

// submitHere records a turn that replica d owns, submitting, has d's
// engine submit it, and returns the record once it is closed.
func submitHere(t *testing.T, d *Dispatcher, key protocol.TurnKey, expires time.Time) *Turn {
	t.Helper()
	now := time.Now().UTC()
	turn := &Turn{Version: 1, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_" + string(key)},
		State: TurnSubmitting, lease: lifecycle.Lease{Owner: d.instance, Until: now.Add(lifecycle.LeaseFor), Epoch: 1},
		CreatedAt: now, ExpiresAt: expires, Deadline: expires.Add(-time.Second)}
	rev, err := d.turns.create(t.Context(), turn)
	if err != nil {
		t.Fatal(err)
	}
	d.gather.track(turn, rev)
	d.engine.Close(string(key))
	var closed *Turn
	testutil.WaitForWhat(t, 30*time.Second, "the turn's record to say it is closed", func() bool {
		have, _, err := d.turns.get(t.Context(), key)
		closed = have
		return err == nil && !have.Open()
	})
	return closed
}

// expiringRefuser refuses every submission as retryable, noting each
// attempt's deadline.
type expiringRefuser struct {
	idlePlatform
	mu        sync.Mutex
	deadlines []time.Time
}

func (p *expiringRefuser) Submit(ctx context.Context, _ *Turn, _ []Output) (*Submission, error) {
	dl, _ := ctx.Deadline()
	p.mu.Lock()
	p.deadlines = append(p.deadlines, dl)
	p.mu.Unlock()
	return nil, &PlatformError{Op: "submit", StatusCode: http.StatusBadGateway, Retryable: true, Err: errors.New("bad gateway")}
}

// Every attempt ends by the run's expiry (and by its own timeout), with one
// context per attempt.
func TestSubmissionAttemptsEndByTheRunsExpiry(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &expiringRefuser{}
	d := replicaOn(t, js, "one", p)
	expires := time.Now().Add(1500 * time.Millisecond)
	if turn := submitHere(t, d, "00112233445566778899aabbccddeeff", expires); turn.State != TurnFailed {
		t.Fatalf("a submission refused until the run expired is %s", turn.State)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.deadlines) < 2 {
		t.Fatalf("%d attempts, want several", len(p.deadlines))
	}
	for i, dl := range p.deadlines {
		if dl.IsZero() || dl.After(expires) {
			t.Fatalf("attempt %d's deadline %v, want by the run's expiry %v", i+1, dl, expires)
		}
	}
}

// Found by review, failing before its fix: results that could not be read
// for longer than one read waits (JetStream away for more than 30 s)
// failed the turn with minutes of its run left, nothing submitted. They
// are read again while the run has time; only then does the turn fail.
func TestUnreadableResultsAreReadAgainWhileTheRunHasTime(t *testing.T) {
	now := time.Now()
	unavailable := fmt.Errorf("dispatch: result of call c1 (f): %w", ErrUnavailable)
	for _, c := range []struct {
		name  string
		left  time.Duration
		err   error
		retry bool
	}{
		{"JetStream away, minutes left", 5 * time.Minute, unavailable, true},
		{"JetStream away, the run about to expire", time.Second, unavailable, false},
		{"a result that is not one", 5 * time.Minute, errors.New("the recorded result names another call"), false},
	} {
		var retry *lifecycle.RetryError
		got := prepareFailed(context.Background(), &Turn{ExpiresAt: now.Add(c.left)}, c.err, now)
		if errors.As(got, &retry) != c.retry || !errors.Is(got, c.err) {
			t.Errorf("%s: %v; want retried %v", c.name, got, c.retry)
		}
	}
}
