package dispatch

import (
	"context"
	"strings"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A call's span carries its attributes when it records, and its trace
// context whenever it has one: a call sampled out still tells the executor
// it was, and with no tracing at all the call carries no header.
func TestACallsSpanPropagatesWhatItHas(t *testing.T) {
	call := &TurnCall{Key: protocol.CallKey("k"), ID: "call_1", Name: "get_weather", Team: "geo"}
	send := func(tel *telemetry) map[string][]string {
		header := map[string][]string{}
		tel.send(context.Background(), call, header, 42).End()
		return header
	}

	rec := tracetest.NewSpanRecorder()
	sampled, err := newTelemetry(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec)), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := send(sampled); !strings.HasSuffix(first(h, "Traceparent"), "-01") {
		t.Errorf("sampled call's header = %v, want a sampled traceparent", h)
	}
	spans := rec.Ended()
	if len(spans) != 1 || spans[0].Name() != "send "+protocol.CallSubject("geo", "get_weather") {
		t.Fatalf("recorded spans = %v", spans)
	}
	attrs := map[string]string{}
	for _, a := range spans[0].Attributes() {
		attrs[string(a.Key)] = a.Value.Emit()
	}
	if attrs["gen_ai.tool.name"] != "get_weather" || attrs["messaging.message.body.size"] != "42" || attrs["toolrelay.team"] != "geo" {
		t.Errorf("recorded attributes = %v", attrs)
	}

	never, err := newTelemetry(sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample())), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := send(never); !strings.HasSuffix(first(h, "Traceparent"), "-00") {
		t.Errorf("sampled-out call's header = %v, want a traceparent that says not sampled", h)
	}

	off, err := newTelemetry(noop.NewTracerProvider(), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if h := send(off); len(h) != 0 {
		t.Errorf("untraced call's header = %v, want none", h)
	}
}

func first(h map[string][]string, key string) string {
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}
