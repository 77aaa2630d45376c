package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// registry is the dispatcher's view of the functions executors announced:
// a cache kept current by watching the registry bucket, with each schema
// compiled once.
type registry struct {
	kv  jetstream.KeyValue
	log *slog.Logger

	mu    sync.RWMutex
	funcs map[string]*function
}

type function struct {
	spec   *protocol.FunctionSpec
	schema *schema.Schema
}

func newRegistry(kv jetstream.KeyValue, log *slog.Logger) *registry {
	return &registry{kv: kv, log: log, funcs: map[string]*function{}}
}

// watch keeps the cache current until ctx ends, re-creating the watcher
// when it closes (for instance after a reconnect).
func (r *registry) watch(ctx context.Context, ready chan<- struct{}) {
	for ctx.Err() == nil {
		w, err := r.kv.WatchAll(ctx)
		if err != nil {
			r.log.Warn("registry watch failed; retrying", "err", err)
			sleepCtx(ctx, time.Second)
			continue
		}
		for e := range w.Updates() {
			if e == nil { // initial values delivered
				if ready != nil {
					close(ready)
					ready = nil
				}
				continue
			}
			r.apply(e)
		}
		_ = w.Stop()
	}
}

func (r *registry) apply(e jetstream.KeyValueEntry) {
	if e.Operation() != jetstream.KeyValuePut {
		r.mu.Lock()
		delete(r.funcs, e.Key())
		r.mu.Unlock()
		return
	}
	f, err := compileFunction(e.Value())
	if err != nil {
		r.log.Error("ignoring invalid registry entry", "fn", e.Key(), "err", err)
		return
	}
	r.mu.Lock()
	r.funcs[f.spec.Name] = f
	r.mu.Unlock()
}

// lookup returns the function, reading the bucket when the cache has not
// seen it yet (an executor that announced it a moment ago).
func (r *registry) lookup(ctx context.Context, name string) (*function, error) {
	r.mu.RLock()
	f := r.funcs[name]
	r.mu.RUnlock()
	if f != nil {
		return f, nil
	}
	e, err := r.kv.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry lookup %s: %w", name, err)
	}
	f, err = compileFunction(e.Value())
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	r.funcs[name] = f
	r.mu.Unlock()
	return f, nil
}

func compileFunction(data []byte) (*function, error) {
	spec, err := protocol.DecodeFunctionSpec(data)
	if err != nil {
		return nil, err
	}
	s, err := schema.Compile(spec.Name, spec.Parameters)
	if err != nil {
		return nil, fmt.Errorf("dispatch: %w", err)
	}
	return &function{spec: spec, schema: s}, nil
}

// validate checks arguments against the function's schema and returns a
// message for the model, or "" if they are valid.
func (f *function) validate(args []byte) string { return f.schema.Check(args) }

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
