package otelconv

import (
	"context"
	"sync"

	"go.opentelemetry.io/otel/trace"
)

// Names keeps span names built from the parts of a subject (a team, a
// function): they repeat on every message, and building each by
// concatenation would allocate a string per message.
type Names struct {
	build func(a, b string) string

	mu sync.RWMutex
	m  map[[2]string]string
}

// maxNames bounds a Names: past it names are built every time (the parts
// come from messages, so their number is not ours to fix).
const maxNames = 4096

// NewNames returns a cache of the names build makes.
func NewNames(build func(a, b string) string) *Names {
	return &Names{build: build, m: map[[2]string]string{}}
}

// Get returns build(a, b), built once.
func (n *Names) Get(a, b string) string {
	key := [2]string{a, b}
	n.mu.RLock()
	name, ok := n.m[key]
	n.mu.RUnlock()
	if ok {
		return name
	}
	name = n.build(a, b)
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.m) < maxNames {
		n.m[key] = name
	}
	return name
}

// The start options of the spans opened for every message (and every
// submission), built once (an
// option passed to Start escapes, so a fresh one would be allocated each
// time). Their attributes are set after Start, and only on a span that
// records: building them for a span nobody keeps (no SDK, or sampled out)
// was a tenth of the bytes a call allocates.
var (
	ProducerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer)}
	ConsumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	ClientSpan   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// WithSpan is ctx carrying span, for injecting into a message, if span has
// a context to propagate: a span sampled out has one too, and tells the
// next hop so. Without one, ctx is returned as it is (its baggage still
// goes out), sparing a context per message.
func WithSpan(ctx context.Context, span trace.Span) context.Context {
	if !span.SpanContext().IsValid() {
		return ctx
	}
	return trace.ContextWithSpan(ctx, span)
}
