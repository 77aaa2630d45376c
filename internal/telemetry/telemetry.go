// Package telemetry sets up OpenTelemetry for the commands: traces exported
// over OTLP when the standard OTEL_* variables ask for it, metrics served in
// the Prometheus text format, W3C trace-context propagation, and logs that
// carry trace and span IDs.
//
// It may import the OpenTelemetry SDK and exporters and the Prometheus
// client; only the commands import it, so the libraries in pkg/ depend on
// OpenTelemetry's API alone.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/idtrace"
)

// Options configures Setup. The zero value exports traces only if the
// environment says so.
type Options struct {
	// Service is service.name unless OTEL_SERVICE_NAME overrides it.
	Service string
	// SpanProcessors receive every span besides any OTLP exporter (the
	// demo's trace printer, tests' recorders).
	SpanProcessors []sdktrace.SpanProcessor
}

// Telemetry is what Setup installed.
type Telemetry struct {
	// TracerProvider is the SDK's when traces go somewhere (an exporter
	// or a span processor), idtrace.Provider() otherwise.
	TracerProvider trace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
	// Metrics serves the metrics in the Prometheus text format.
	Metrics  http.Handler
	shutdown []func(context.Context) error
}

// Setup installs tracer and meter providers and the W3C propagator as the
// process-wide defaults. Traces go over OTLP when OTEL_EXPORTER_OTLP_ENDPOINT
// (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set, with
// OTEL_EXPORTER_OTLP_PROTOCOL "grpc" or "http/protobuf" (the default);
// sampling follows OTEL_TRACES_SAMPLER; OTEL_SDK_DISABLED=true turns export
// off. With no exporter and no span processor, spans are idtrace's: they
// record nothing and keep their IDs. Call Shutdown to flush.
func Setup(ctx context.Context, opts Options) (*Telemetry, error) {
	if os.Getenv("OTEL_SERVICE_NAME") == "" && opts.Service != "" {
		// resource.WithFromEnv reads OTEL_SERVICE_NAME; default it.
		_ = os.Setenv("OTEL_SERVICE_NAME", opts.Service)
	}
	res, err := resource.New(ctx, resource.WithFromEnv(), resource.WithTelemetrySDK(), resource.WithHost(),
		resource.WithSchemaURL(semconv.SchemaURL))
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	t := &Telemetry{TracerProvider: idtrace.Provider()}

	topts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	for _, p := range opts.SpanProcessors {
		topts = append(topts, sdktrace.WithSpanProcessor(p))
	}
	exp, err := TraceExporter(ctx)
	if err != nil {
		return nil, err
	} else if exp != nil {
		topts = append(topts, sdktrace.WithBatcher(exp))
	}
	if exp != nil || len(opts.SpanProcessors) > 0 {
		tp := sdktrace.NewTracerProvider(topts...)
		t.TracerProvider = tp
		t.shutdown = append(t.shutdown, tp.Shutdown)
	}

	if t.MeterProvider, t.Metrics, err = Prometheus(res); err != nil {
		return nil, err
	}
	t.shutdown = append(t.shutdown, t.MeterProvider.Shutdown)

	otel.SetTracerProvider(t.TracerProvider)
	otel.SetMeterProvider(t.MeterProvider)
	otel.SetTextMapPropagator(Propagator())
	return t, nil
}

// Prometheus returns a meter provider whose metrics the handler serves in
// the Prometheus text format, with the Go runtime and process metrics.
// res may be nil.
func Prometheus(res *resource.Resource) (*sdkmetric.MeterProvider, http.Handler, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exporter, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	opts := []sdkmetric.Option{sdkmetric.WithReader(exporter)}
	if res != nil {
		opts = append(opts, sdkmetric.WithResource(res))
	}
	return sdkmetric.NewMeterProvider(opts...), promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), nil
}

// Propagator is W3C trace context and baggage.
func Propagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// TraceExporter returns the OTLP exporter the OTEL_EXPORTER_OTLP_*
// variables ask for, as Setup describes, or nil when they ask for none.
func TraceExporter(ctx context.Context) (sdktrace.SpanExporter, error) {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return nil, nil
	}
	if os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, nil
	}
	proto := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch proto {
	case "grpc":
		return otlptracegrpc.New(ctx) // reads the OTEL_EXPORTER_OTLP_* variables
	case "", "http/protobuf":
		return otlptracehttp.New(ctx)
	}
	return nil, fmt.Errorf("telemetry: OTEL_EXPORTER_OTLP_PROTOCOL %q is not supported (use grpc or http/protobuf)", proto)
}

// Close flushes and stops the providers, waiting at most 5 seconds: for a
// deferred call when a command exits.
func (t *Telemetry) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.Shutdown(ctx)
}

// Shutdown flushes and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for _, f := range t.shutdown {
		errs = append(errs, f(ctx))
	}
	return errors.Join(errs...)
}

// LogHandler adds trace_id and span_id to records logged with a context
// that carries a span, so logs join traces.
func LogHandler(h slog.Handler) slog.Handler { return traceHandler{h} }

type traceHandler struct{ slog.Handler }

func (h traceHandler) Handle(ctx context.Context, r slog.Record) error {
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		r.AddAttrs(slog.String("trace_id", sc.TraceID().String()), slog.String("span_id", sc.SpanID().String()))
	}
	return h.Handler.Handle(ctx, r)
}

func (h traceHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return traceHandler{h.Handler.WithAttrs(attrs)}
}

func (h traceHandler) WithGroup(name string) slog.Handler {
	return traceHandler{h.Handler.WithGroup(name)}
}
