// Package idtrace is the tracer provider of a process that exports no
// traces. It may import only OpenTelemetry's API packages.
package idtrace

import (
	"context"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// Provider returns a tracer provider for a process that exports no traces:
// its spans record nothing, but each has a span context as the SDK's
// would. A span continues its parent's trace (a new one at a root) with a
// fresh span ID and the parent's trace flags; a root is sampled, as under
// the SDK's default sampler. So logs still carry trace and span IDs, a
// turn still names its trace, and a call's trace context still reaches the
// executors, which record their part of the trace if they export it.
//
// The SDK's provider with no exporter would record every span for no
// reader: its attributes, events and the span itself are built and thrown
// away, which cost the dispatcher about a third of its throughput at turns
// of 16 calls (docs/benchmarks.md).
func Provider() trace.TracerProvider { return idsProvider{} }

type idsProvider struct{ embedded.TracerProvider }

func (idsProvider) Tracer(string, ...trace.TracerOption) trace.Tracer { return idsTracer{} }

type idsTracer struct{ embedded.Tracer }

func (idsTracer) Start(ctx context.Context, _ string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanContextFromContext(ctx)
	if len(opts) > 0 {
		if cfg := trace.NewSpanStartConfig(opts...); cfg.NewRoot() {
			parent = trace.SpanContext{}
		}
	}
	scc := trace.SpanContextConfig{TraceID: parent.TraceID(), TraceFlags: parent.TraceFlags(), TraceState: parent.TraceState()}
	if !parent.IsValid() {
		for !scc.TraceID.IsValid() {
			binary.BigEndian.PutUint64(scc.TraceID[:8], rand.Uint64())
			binary.BigEndian.PutUint64(scc.TraceID[8:], rand.Uint64())
		}
		scc.TraceFlags = trace.FlagsSampled
		scc.TraceState = trace.TraceState{}
	}
	for !scc.SpanID.IsValid() {
		binary.BigEndian.PutUint64(scc.SpanID[:], rand.Uint64())
	}
	span := &idsSpan{sc: trace.NewSpanContext(scc)}
	return trace.ContextWithSpan(ctx, span), span
}

// idsSpan is a span that records nothing and has a span context.
type idsSpan struct {
	noop.Span
	sc trace.SpanContext
}

func (s *idsSpan) SpanContext() trace.SpanContext       { return s.sc }
func (s *idsSpan) TracerProvider() trace.TracerProvider { return idsProvider{} }
