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
