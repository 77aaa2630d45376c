package exec

import (
	"context"
	"log/slog"
	"sync"

	"github.com/toolrelay/toolrelay/internal/lease"
)

// served is what this process tells the dispatchers it serves: each of its
// functions while the function's consumer exists and pulls. A worker that
// loses its consumer for good suspends the function's declaration, and
// resumes it once the consumer is back. Safe for concurrent use.
type served struct {
	log *slog.Logger

	mu     sync.Mutex
	keeper *lease.Keeper // nil until Run has declared
	down   map[string]bool
}

func newServed(log *slog.Logger) *served { return &served{log: log, down: map[string]bool{}} }

// attach hands over the keeper of the declarations once they are sent,
// withdrawing those of functions that went down meanwhile.
func (s *served) attach(ctx context.Context, k *lease.Keeper) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keeper = k
	for fn := range s.down {
		s.withdraw(ctx, fn)
	}
}

// suspend withdraws fn's declaration: this process does not serve it now.
func (s *served) suspend(ctx context.Context, fn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.down[fn] = true
	if s.keeper != nil {
		s.withdraw(ctx, fn)
	}
}

// withdraw sends the withdrawal of fn's declaration; s.mu is held.
func (s *served) withdraw(ctx context.Context, fn string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	if err := s.keeper.Suspend(ctx, fn); err != nil {
		s.log.Warn("withdrawing the function's declaration failed; it lapses with its lease", "fn", fn, "err", err)
	}
}

// resume declares fn again: its consumer is back.
func (s *served) resume(ctx context.Context, fn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.down, fn)
	if s.keeper == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
	defer cancel()
	if err := s.keeper.Resume(ctx, fn); err != nil {
		s.log.Warn("declaring the function again failed; the next renewal declares it", "fn", fn, "err", err)
	}
}
