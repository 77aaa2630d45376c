package demo

import (
	"fmt"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// traceOf returns the spans of the trace whose root turn span has key, once
// its turn span has ended (the last spans end right after submission).
func traceOf(rec *tracetest.SpanRecorder, key protocol.TurnKey, within time.Duration) []sdktrace.ReadOnlySpan {
	deadline := time.Now().Add(within)
	for {
		spans := rec.Ended()
		var id trace.TraceID
		for _, s := range spans {
			for _, a := range s.Attributes() {
				if a.Key == "toolrelay.turn.key" && a.Value.AsString() == string(key) && strings.HasPrefix(s.Name(), "turn ") {
					id = s.SpanContext().TraceID()
				}
			}
		}
		if id.IsValid() {
			var out []sdktrace.ReadOnlySpan
			for _, s := range spans {
				if s.SpanContext().TraceID() == id {
					out = append(out, s)
				}
			}
			return out
		}
		if time.Now().After(deadline) {
			return nil
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// printTree writes spans as an indented tree with each span's start
// (relative to the trace's first span) and duration.
func printTree(out *lockedWriter, spans []sdktrace.ReadOnlySpan, indent string) {
	if len(spans) == 0 {
		return
	}
	byID := map[trace.SpanID]bool{}
	children := map[trace.SpanID][]sdktrace.ReadOnlySpan{}
	start := spans[0].StartTime()
	for _, s := range spans {
		byID[s.SpanContext().SpanID()] = true
		if s.StartTime().Before(start) {
			start = s.StartTime()
		}
	}
	var roots []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if p := s.Parent().SpanID(); s.Parent().IsValid() && byID[p] {
			children[p] = append(children[p], s)
		} else {
			roots = append(roots, s)
		}
	}
	order := func(list []sdktrace.ReadOnlySpan) {
		slices.SortFunc(list, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	}
	order(roots)
	out.printf("%strace %s\n", indent, spans[0].SpanContext().TraceID())
	var walk func(s sdktrace.ReadOnlySpan, prefix, branch string)
	walk = func(s sdktrace.ReadOnlySpan, prefix, branch string) {
		label := prefix + branch + s.Name()
		out.printf("%s%-62s +%-8s %s\n", indent, label, ms(s.StartTime().Sub(start)), ms(s.EndTime().Sub(s.StartTime())))
		kids := children[s.SpanContext().SpanID()]
		order(kids)
		next := prefix
		switch branch {
		case "├─ ":
			next += "│  "
		case "└─ ":
			next += "   "
		}
		for i, k := range kids {
			b := "├─ "
			if i == len(kids)-1 {
				b = "└─ "
			}
			walk(k, next, b)
		}
	}
	for _, r := range roots {
		walk(r, "  ", "")
	}
}

func ms(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d.Microseconds())/1000)
}
