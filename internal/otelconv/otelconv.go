// Package otelconv holds the OpenTelemetry names the dispatcher (package
// dispatch) and executors (package exec) must agree on, so that one trace
// and one set of metrics read the same on both sides: the propagation of
// trace context in message headers, the attribute keys both record, and the
// bucket boundaries of their duration histograms.
//
// It owns names only, no instruments. It may import only OpenTelemetry's
// API packages; pkg/dispatch and pkg/exec import it, it imports neither.
package otelconv

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
)

// Propagator is the propagation the wire contract fixes: traceparent and
// tracestate (and baggage) in the message headers, whatever global
// propagator the process installed.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// Attribute keys both sides record. Tool name and call ID follow the GenAI
// semantic conventions; function and outcome are short because they label
// metrics.
const (
	TurnKey    = attribute.Key("toolrelay.turn.key")
	Team       = attribute.Key("toolrelay.team")
	Platform   = attribute.Key("toolrelay.platform")
	Scope      = attribute.Key("toolrelay.scope")
	Outcome    = attribute.Key("toolrelay.outcome")
	ToolName   = attribute.Key("gen_ai.tool.name")
	ToolCallID = attribute.Key("gen_ai.tool.call.id")
	Function   = attribute.Key("function")
)

// DurationBuckets are the boundaries, in seconds, of every histogram of how
// long something took: from a millisecond to the ten minutes a run lives.
func DurationBuckets() []float64 {
	return []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}
}
