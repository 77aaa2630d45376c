package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Where a single-call turn's time goes: the closed loop of the toolrelay
// phase once more, on a stack that records its spans, each turn's steps
// read from its trace. Recording spans costs a little, so these figures
// sit a little above the untraced loop's; what they are for is the split.
// The spans do not cover toolrelay's encoding and decoding of the call and
// the result, so the two hops include them.

// The moments of a traced turn, in the order they happen: the first and
// the last as the bench saw them, the rest from the turn's spans. Step i
// runs from moment i to moment i+1.
const (
	intake = iota
	recording
	sent
	delivered
	resultSent
	gathered
	gatheredEnd
	submitting
	reached
	moments
)

type turnTrace [moments]time.Time

// steps name the stretches between consecutive moments.
var steps = [moments - 1]struct{ name, why string }{
	{"intake → the turn's span begins", "each call's function resolved, its arguments checked against the schema"},
	{"→ call goes out", "the turn record (created by compare-and-set, held by this replica) and the deadline timer, written together and both awaited; the call encoded"},
	{"→ executor has the call", "the call stored (message ID, TTL), delivered and decoded: the floor's first hop, with toolrelay's decoding"},
	{"→ executor publishes the result", "the executor's bookkeeping and the handler"},
	{"→ gatherer has the result", "the result encoded, stored (first wins), delivered and decoded: the floor's second hop, with toolrelay's coding"},
	{"→ gatherer done with it", "the turn found, the result acknowledged and added"},
	{"→ submission begins", "a worker of the dispatcher's takes the turn up; held by this replica, it is submitted with no compare-and-set first"},
	{"→ the platform has it", "the outputs gathered and handed to the platform client"},
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
	s.sink.reached = map[trace.TraceID]reach{}
	s.sink.mu.Unlock()
	began := make(map[protocol.TurnKey]time.Time, cfg.samples)
	for range cfg.samples {
		req := turn("noop", 1)
		done := s.sink.expect(req.Key())
		began[req.Key()] = time.Now()
		if _, err := s.d.Intake(ctx, req); err != nil {
			return err
		}
		select {
		case <-done:
		case <-time.After(time.Minute):
			return fmt.Errorf("turn %s not submitted within a minute", req.Key())
		}
	}
	s.stop() // every span ended
	s.sink.mu.Lock()
	arrived := s.sink.reached
	s.sink.mu.Unlock()
	res, err := splitTraces(rec.Ended(), began, arrived)
	if err != nil {
		return err
	}
	if res.turns < cfg.samples {
		r.note("breakdown: %d of %d turns had every span; the split is of those", res.turns, cfg.samples)
	}
	r.breakdown = res
	for i, st := range steps {
		fmt.Printf("   %-36s p50 %6.1f µs\n", st.name, usFloat(res.p50[i]))
	}
	fmt.Printf("   %-36s p50 %6.1f µs (%d traced turns)\n", "intake → the platform has it", usFloat(res.total), res.turns)
	return nil
}

// splitTraces reads each turn's moments from its spans, by their names
// (the span names are part of toolrelay's documented tracing). A span seen
// twice (a redelivery) counts from its first start.
func splitTraces(spans []sdktrace.ReadOnlySpan, began map[protocol.TurnKey]time.Time, arrived map[trace.TraceID]reach) (*breakdownResult, error) {
	byTrace := map[trace.TraceID]*turnTrace{}
	first := func(at *time.Time, t time.Time) {
		if at.IsZero() || t.Before(*at) {
			*at = t
		}
	}
	for _, sp := range spans {
		id := sp.SpanContext().TraceID()
		t := byTrace[id]
		if t == nil {
			t = &turnTrace{}
			byTrace[id] = t
		}
		switch name := sp.Name(); {
		case strings.HasPrefix(name, "turn "):
			first(&t[recording], sp.StartTime())
		case strings.HasPrefix(name, "send fncall."):
			first(&t[sent], sp.StartTime())
		case strings.HasPrefix(name, "process fncall."):
			first(&t[delivered], sp.StartTime())
		case strings.HasPrefix(name, "send fnresult."):
			first(&t[resultSent], sp.StartTime())
		case strings.HasPrefix(name, "process fnresult."):
			if t[gathered].IsZero() || sp.StartTime().Before(t[gathered]) {
				t[gathered], t[gatheredEnd] = sp.StartTime(), sp.EndTime()
			}
		case strings.HasPrefix(name, "submit "):
			first(&t[submitting], sp.StartTime())
		}
	}
	per := make([]latencies, len(steps))
	var total latencies
	for id, t := range byTrace {
		r := arrived[id]
		t[intake], t[reached] = began[r.key], r.at
		if slices.ContainsFunc(t[:], time.Time.IsZero) {
			continue // not a whole turn (a span of the stack's start)
		}
		for i := range steps {
			per[i] = append(per[i], t[i+1].Sub(t[i]))
		}
		total = append(total, t[reached].Sub(t[intake]))
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
