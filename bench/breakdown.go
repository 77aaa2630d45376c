package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// Where a single-call turn's time goes: the closed loop of the toolrelay
// phase once more, on a stack that records its spans, each turn's steps
// read from its trace. Recording spans costs a little, so these figures
// sit a little above the untraced loop's; what they are for is the split.

// step is one stretch of a turn, between two moments its trace shows.
type step struct {
	name, why string
	from, to  func(*turnTrace) time.Time
}

// turnTrace holds the moments of one traced turn.
type turnTrace struct {
	intake, sent, delivered, resultSent, gathered, gatheredEnd, submitting, reached time.Time
}

var steps = []step{
	{"intake → call goes out", "resolve and check the call, then the turn record (compare-and-set) and the deadline timer, written together and both awaited",
		func(t *turnTrace) time.Time { return t.intake }, func(t *turnTrace) time.Time { return t.sent }},
	{"→ executor has the call", "the call stored (message ID, TTL) and delivered: the floor's first hop",
		func(t *turnTrace) time.Time { return t.sent }, func(t *turnTrace) time.Time { return t.delivered }},
	{"→ executor publishes the result", "decode, the handler, encode",
		func(t *turnTrace) time.Time { return t.delivered }, func(t *turnTrace) time.Time { return t.resultSent }},
	{"→ gatherer has the result", "the result stored (first wins) and delivered: the floor's second hop",
		func(t *turnTrace) time.Time { return t.resultSent }, func(t *turnTrace) time.Time { return t.gathered }},
	{"→ gatherer done with it", "decode, the turn found, acknowledged",
		func(t *turnTrace) time.Time { return t.gathered }, func(t *turnTrace) time.Time { return t.gatheredEnd }},
	{"→ submission begins", "the `collecting → submitting` compare-and-set (only one replica submits)",
		func(t *turnTrace) time.Time { return t.gatheredEnd }, func(t *turnTrace) time.Time { return t.submitting }},
	{"→ the platform has it", "the outputs gathered and handed to the platform client",
		func(t *turnTrace) time.Time { return t.submitting }, func(t *turnTrace) time.Time { return t.reached }},
}

// breakdownResult is each step's p50 over the traced turns.
type breakdownResult struct {
	turns int
	p50   []time.Duration
	total time.Duration // p50 of intake → the platform has it
}

func measureBreakdown(ctx context.Context, cfg config, r *report) error {
	env, err := startNATS(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.WithoutCancel(ctx))
	s, err := newStack(ctx, env, 1, noop, stackOptions{tracer: tp})
	if err != nil {
		return err
	}
	defer s.stop()
	s.sink.mu.Lock()
	s.sink.reached = map[trace.TraceID]time.Time{}
	s.sink.mu.Unlock()
	for range cfg.samples {
		req := turn("noop", 1)
		done := s.sink.expect(req.Key())
		if _, err := s.d.Intake(ctx, req); err != nil {
			return err
		}
		<-done
	}
	s.stop() // every span ended
	s.sink.mu.Lock()
	reached := s.sink.reached
	s.sink.mu.Unlock()
	res, err := splitTraces(rec.Ended(), reached)
	if err != nil {
		return err
	}
	r.breakdown = res
	for i, st := range steps {
		fmt.Printf("   %-36s p50 %6.1f µs\n", st.name, usFloat(res.p50[i]))
	}
	fmt.Printf("   %-36s p50 %6.1f µs (%d traced turns)\n", "intake → the platform has it", usFloat(res.total), res.turns)
	return nil
}

// splitTraces reads each turn's moments from its spans, by their names
// (the span names are part of toolrelay's documented tracing).
func splitTraces(spans []sdktrace.ReadOnlySpan, reached map[trace.TraceID]time.Time) (*breakdownResult, error) {
	byTrace := map[trace.TraceID]*turnTrace{}
	for _, sp := range spans {
		id := sp.SpanContext().TraceID()
		t := byTrace[id]
		if t == nil {
			t = &turnTrace{}
			byTrace[id] = t
		}
		switch name := sp.Name(); {
		case strings.HasPrefix(name, "turn "):
			t.intake = sp.StartTime()
		case strings.HasPrefix(name, "send fncall."):
			t.sent = sp.StartTime()
		case strings.HasPrefix(name, "process fncall."):
			t.delivered = sp.StartTime()
		case strings.HasPrefix(name, "send fnresult."):
			t.resultSent = sp.StartTime()
		case strings.HasPrefix(name, "process fnresult."):
			t.gathered, t.gatheredEnd = sp.StartTime(), sp.EndTime()
		case strings.HasPrefix(name, "submit "):
			t.submitting = sp.StartTime()
		}
	}
	per := make([]latencies, len(steps))
	var total latencies
	for id, t := range byTrace {
		t.reached = reached[id]
		if t.intake.IsZero() || t.sent.IsZero() || t.delivered.IsZero() || t.resultSent.IsZero() ||
			t.gathered.IsZero() || t.submitting.IsZero() || t.reached.IsZero() {
			continue // not a whole turn (a span of the stack's start)
		}
		for i, st := range steps {
			per[i] = append(per[i], st.to(t).Sub(st.from(t)))
		}
		total = append(total, t.reached.Sub(t.intake))
	}
	if len(total) == 0 {
		return nil, fmt.Errorf("no whole turn among %d traces: have the span names changed?", len(byTrace))
	}
	res := &breakdownResult{turns: len(total), total: total.pct(50)}
	for _, l := range per {
		res.p50 = append(res.p50, l.pct(50))
	}
	return res, nil
}

func usFloat(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
