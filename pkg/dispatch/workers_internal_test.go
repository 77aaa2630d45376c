package dispatch

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Work never waits for a worker: with every worker busy, the next job
// starts anyway; a finished worker takes later jobs; stop lets Run's wait
// group end.
func TestWorkersNeverMakeWorkWait(t *testing.T) {
	var wg sync.WaitGroup
	w := newWorkers(context.Background(), &wg)
	release := make(chan struct{})
	started := make(chan struct{}, 10)
	for range 10 {
		w.run(func(context.Context) { started <- struct{}{}; <-release })
	}
	for i := range 10 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 10 jobs started while the others were busy", i)
		}
	}
	close(release)
	var ran sync.WaitGroup
	for range 100 {
		ran.Add(1)
		w.run(func(context.Context) { ran.Done() })
	}
	ran.Wait()
	w.stop()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("idle workers did not return after stop")
	}
}
