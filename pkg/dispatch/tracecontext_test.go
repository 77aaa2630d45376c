package dispatch

import (
	"context"
	"encoding/json"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// A trace context survives the record: injected, encoded as the record
// encodes it, decoded and extracted, it is the context it was — and its
// JSON is what records written with a map of headers held.
func TestTraceContextRoundTrip(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:  trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8}, TraceFlags: trace.FlagsSampled,
	})
	ts, err := trace.ParseTraceState("vendor=a")
	if err != nil {
		t.Fatal(err)
	}
	sc = sc.WithTraceState(ts)
	member, _ := baggage.NewMember("team", "billing")
	bag, _ := baggage.New(member)
	ctx := baggage.ContextWithBaggage(trace.ContextWithSpanContext(context.Background(), sc), bag)

	var turn Turn
	otelconv.Propagator.Inject(ctx, &turn.Trace)
	headers := propagation.MapCarrier{}
	otelconv.Propagator.Inject(ctx, headers)
	if len(headers) != 3 {
		t.Fatalf("the propagator wrote %v; the test wants all three fields", headers)
	}

	rec, err := appendTurn(nil, &turn)
	if err != nil {
		t.Fatal(err)
	}
	var asMap struct {
		Trace map[string]string `json:"trace"`
	}
	if err := json.Unmarshal(rec, &asMap); err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(map[string]string(headers))
	got, _ := json.Marshal(asMap.Trace)
	testutil.SameJSON(t, want, got)

	var back Turn
	if err := json.Unmarshal(rec, &back); err != nil {
		t.Fatal(err)
	}
	out := otelconv.Propagator.Extract(context.Background(), &back.Trace)
	if got := trace.SpanContextFromContext(out); !got.Equal(sc.WithRemote(true)) {
		t.Errorf("span context after the record: %v, want %v", got, sc)
	}
	if got := baggage.FromContext(out).Member("team").Value(); got != "billing" {
		t.Errorf("baggage after the record: team=%q", got)
	}
	if id := back.Trace.TraceID(); id != sc.TraceID().String() {
		t.Errorf("TraceID() = %q, want %q", id, sc.TraceID())
	}
}
