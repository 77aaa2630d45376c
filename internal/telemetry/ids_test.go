package telemetry_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/toolrelay/toolrelay/internal/telemetry"
)

// setup runs telemetry.Setup with the environment a deployment that
// exports nothing has, plus env.
func setup(t *testing.T, opts telemetry.Options, env ...string) *telemetry.Telemetry {
	t.Helper()
	t.Setenv("OTEL_SERVICE_NAME", "toolrelay-test")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	t.Setenv("OTEL_SDK_DISABLED", "")
	for i := 0; i+1 < len(env); i += 2 {
		t.Setenv(env[i], env[i+1])
	}
	tel, err := telemetry.Setup(t.Context(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = tel.Shutdown(ctx)                            // an export that cannot land gives up
		otel.SetTracerProvider(noop.NewTracerProvider()) // for the next test
	})
	return tel
}

// With nowhere to send spans, the commands record none, and every span
// still has the IDs that logs, a turn's record and the executors' traces
// are joined by.
func TestWithoutAnExporterSpansRecordNothingAndKeepTheirIDs(t *testing.T) {
	setup(t, telemetry.Options{})
	tracer := otel.GetTracerProvider().Tracer("test")

	ctx, root := tracer.Start(t.Context(), "turn")
	defer root.End()
	if root.IsRecording() {
		t.Fatal("a span is recorded with no exporter and no processor to read it")
	}
	rc := root.SpanContext()
	if !rc.IsValid() || !rc.IsSampled() {
		t.Fatalf("root span context %v: want valid and sampled, as under the SDK's default sampler", rc)
	}
	cctx, child := tracer.Start(ctx, "send")
	cc := child.SpanContext()
	if cc.TraceID() != rc.TraceID() || cc.SpanID() == rc.SpanID() || !cc.SpanID().IsValid() || !cc.IsSampled() {
		t.Fatalf("child %v of %v: want the parent's trace and flags with a span ID of its own", cc, rc)
	}
	_, other := tracer.Start(t.Context(), "turn")
	if other.SpanContext().TraceID() == rc.TraceID() {
		t.Fatal("two roots share a trace ID")
	}
	_, fresh := tracer.Start(ctx, "detached", trace.WithNewRoot())
	if fresh.SpanContext().TraceID() == rc.TraceID() {
		t.Fatal("a span started as a new root continues its parent's trace")
	}

	// The child's context is what a call carries to its executor.
	carrier := propagation.MapCarrier{}
	otel.GetTextMapPropagator().Inject(cctx, carrier)
	want := "00-" + cc.TraceID().String() + "-" + cc.SpanID().String() + "-01"
	if carrier["traceparent"] != want {
		t.Fatalf("traceparent %q; want %q", carrier["traceparent"], want)
	}

	var logs bytes.Buffer
	slog.New(telemetry.LogHandler(slog.NewTextHandler(&logs, nil))).InfoContext(cctx, "call published")
	if !strings.Contains(logs.String(), "trace_id="+cc.TraceID().String()) || !strings.Contains(logs.String(), "span_id="+cc.SpanID().String()) {
		t.Fatalf("log line %q lacks the span's IDs", logs.String())
	}
}

// A parent that was not sampled upstream stays not sampled: an executor
// that exports does not record a trace its caller chose to drop.
func TestWithoutAnExporterAParentsFlagsCarryOn(t *testing.T) {
	setup(t, telemetry.Options{})
	upstream := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, Remote: true})
	_, span := otel.Tracer("test").Start(trace.ContextWithRemoteSpanContext(t.Context(), upstream), "process")
	sc := span.SpanContext()
	if sc.TraceID() != upstream.TraceID() || sc.IsSampled() || sc.SpanID() == upstream.SpanID() {
		t.Fatalf("span %v under the unsampled parent %v", sc, upstream)
	}
}

// Where spans have a reader, a processor or an exporter, they are the
// SDK's and recorded.
func TestWithAReaderSpansAreRecorded(t *testing.T) {
	t.Run("processor", func(t *testing.T) {
		rec := tracetest.NewSpanRecorder()
		setup(t, telemetry.Options{SpanProcessors: []sdktrace.SpanProcessor{rec}})
		_, span := otel.Tracer("test").Start(t.Context(), "turn")
		span.End()
		if len(rec.Ended()) != 1 {
			t.Fatalf("the processor saw %d spans; want 1", len(rec.Ended()))
		}
	})
	t.Run("exporter", func(t *testing.T) {
		// Nothing listens there; the span is recorded all the same, and
		// the export fails at shutdown, which is not the test's concern.
		setup(t, telemetry.Options{}, "OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
		_, span := otel.Tracer("test").Start(t.Context(), "turn")
		defer span.End()
		if !span.IsRecording() {
			t.Fatal("with an exporter configured, spans are not recorded")
		}
	})
}
