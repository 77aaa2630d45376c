// Package backoff is the one exponential backoff with jitter that the
// dispatcher and executors use for everything they retry.
//
// It imports only the standard library, so anything may import it.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff yields growing delays: Initial, then Factor times the last, up to
// Max, each shortened by up to a quarter at random so that many clients
// retrying at once spread out. The zero Factor is 2. A Backoff is not safe
// for concurrent use; make one per retry loop.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
	Factor  float64

	cur time.Duration
}

// Next returns the delay before the next try.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Initial
	} else {
		b.cur = b.grow(b.cur)
	}
	return Jitter(b.cur)
}

// Reset makes the next delay Initial again, after a success.
func (b *Backoff) Reset() { b.cur = 0 }

// Delay is the delay before try n+1 after n failed tries (n ≥ 1), without
// keeping state: Initial·Factorⁿ⁻¹ capped at Max, with jitter.
func (b Backoff) Delay(n int) time.Duration {
	d := b.Initial
	for i := 1; i < n && d < b.Max; i++ {
		d = b.grow(d)
	}
	return Jitter(min(d, max(b.Max, b.Initial)))
}

func (b *Backoff) grow(d time.Duration) time.Duration {
	f := b.Factor
	if f <= 1 {
		f = 2
	}
	next := time.Duration(float64(d) * f)
	if b.Max > 0 && next > b.Max {
		next = b.Max
	}
	return next
}

// Jitter returns d less up to 25%, at random.
func Jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return d
	}
	return d - time.Duration(rand.Int64N(int64(d)/4+1))
}

// Sleep waits for d or until ctx ends, and reports whether it waited the
// whole time.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
