package dispatch

import (
	"context"
	"sync"
	"time"
)

// workers runs the dispatcher's background work (closing and submitting
// turns, watch drivers, the sweep) on goroutines that stay for a while
// after their work is done and take the next. A turn's close runs deep
// (record, platform client, telemetry), and a fresh goroutine grew its
// stack to that depth again for every turn; a worker grows it once.
// Work never waits for a worker: with none idle, one is started.
type workers struct {
	ctx  context.Context // what the work runs under
	wg   *sync.WaitGroup // every worker, until it returns
	work chan func(context.Context)
	quit chan struct{}
}

// workerIdle is how long a worker waits for more work before it returns.
const workerIdle = 10 * time.Second

func newWorkers(ctx context.Context, wg *sync.WaitGroup) *workers {
	return &workers{ctx: ctx, wg: wg, work: make(chan func(context.Context)), quit: make(chan struct{})}
}

// run runs f on an idle worker, or on a new one.
func (w *workers) run(f func(context.Context)) {
	select {
	case w.work <- f:
	default:
		w.wg.Go(func() {
			f(w.ctx)
			w.serve()
		})
	}
}

func (w *workers) serve() {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		select {
		case f := <-w.work:
			f(w.ctx)
			idle.Reset(workerIdle)
		case <-idle.C:
			return
		case <-w.quit:
			return
		}
	}
}

// stop ends the idle workers; busy ones return when their work does. No
// run may follow.
func (w *workers) stop() { close(w.quit) }
