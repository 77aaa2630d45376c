package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"

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
	schema *jsonschema.Schema
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
	schema, err := compileSchema(spec.Name, spec.Parameters)
	if err != nil {
		return nil, err
	}
	return &function{spec: spec, schema: schema}, nil
}

// compileSchema compiles a function's parameter schema. References to other
// documents are refused: a schema must be self-contained.
func compileSchema(name string, raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("dispatch: schema of %s: %w", name, err)
	}
	c := jsonschema.NewCompiler()
	c.UseLoader(refuseLoader{})
	url := "toolrelay:///functions/" + name
	if err := c.AddResource(url, doc); err != nil {
		return nil, fmt.Errorf("dispatch: schema of %s: %w", name, err)
	}
	s, err := c.Compile(url)
	if err != nil {
		return nil, fmt.Errorf("dispatch: schema of %s: %w", name, err)
	}
	return s, nil
}

type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema references %s: only self-contained schemas are allowed", url)
}

// validate checks arguments against the function's schema and returns a
// message for the model, or "" if they are valid.
func (f *function) validate(args []byte) string {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(args))
	if err != nil {
		return fmt.Sprintf("The arguments for %s are not valid JSON (%v). Call it again with a JSON object that matches its parameters.", f.spec.Name, err)
	}
	if err := f.schema.Validate(inst); err != nil {
		msg := err.Error()
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			msg = describeViolations(ve)
		}
		return protocol.Truncate(fmt.Sprintf("The arguments for %s do not match its parameters: %s. Fix them and call it again.", f.spec.Name, msg), 2048)
	}
	return ""
}

var printer = message.NewPrinter(language.English)

// describeViolations lists the leaf errors as "at /path: message".
func describeViolations(ve *jsonschema.ValidationError) string {
	var parts []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			loc := "/" + strings.Join(e.InstanceLocation, "/")
			parts = append(parts, fmt.Sprintf("at %s: %s", loc, e.ErrorKind.LocalizedString(printer)))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return strings.Join(parts, "; ")
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
