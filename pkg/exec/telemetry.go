package exec

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/attrcache"
	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// w3c is the propagation the wire contract fixes, shared with the
// dispatcher.
var w3c = otelconv.Propagator

const instrumentation = "github.com/toolrelay/toolrelay/pkg/exec"

var (
	attrToolName   = otelconv.ToolName
	attrToolCallID = otelconv.ToolCallID
	attrOperation  = attribute.Key("gen_ai.operation.name")
	attrTurnKey    = otelconv.TurnKey
	attrTeam       = otelconv.Team
	attrAttempt    = attribute.Key("toolrelay.attempt")
	attrOutcome    = otelconv.Outcome
	attrFunction   = otelconv.Function
	attrReason     = attribute.Key("reason")
	attrExecutor   = attribute.Key("toolrelay.executor")
	attrDelivered  = attribute.Key("messaging.nats.delivery_count")
	attrPlatform   = otelconv.Platform
	attrScope      = otelconv.Scope
	attrArgsSize   = attribute.Key("gen_ai.tool.call.arguments.size")
	attrOutputSize = attribute.Key("gen_ai.tool.call.result.size")
)

// Tracing is middleware that runs each handler in an "execute_tool
// <function>" span (the GenAI semantic conventions), a child of the call's
// process span, marking errors. Executors add it first unless
// Options.NoTelemetry is set; a nil provider means the global one.
func Tracing(tp trace.TracerProvider) Middleware {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	tracer := tp.Tracer(instrumentation)
	names := otelconv.NewNames(func(fn, _ string) string { return "execute_tool " + fn })
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, inv *Invocation) ([]byte, error) {
			ctx, span := tracer.Start(ctx, names.Get(inv.Call.Function, ""))
			defer span.End()
			recording := span.IsRecording()
			if recording {
				span.SetAttributes(attrOperation.String("execute_tool"), attrToolName.String(inv.Call.Function),
					attrToolCallID.String(inv.Call.CallID), attrAttempt.Int(inv.Attempt),
					attrArgsSize.Int(len(inv.Call.Arguments)))
			}
			out, err := next.Handle(ctx, inv)
			if err != nil {
				span.RecordError(err)
				span.SetStatus(codes.Error, "the function failed")
			} else if recording {
				span.SetAttributes(attrOutputSize.Int(len(out)))
			}
			return out, err
		})
	}
}

// Metrics is middleware that counts calls by function and outcome and
// records how long handlers ran. Executors add it unless
// Options.NoTelemetry is set; a nil provider means the global one.
func Metrics(mp metric.MeterProvider) Middleware {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation)
	calls, _ := m.Int64Counter("toolrelay.executor.calls", metric.WithDescription("Handler runs, by function and outcome (ok or error)."))
	duration, _ := m.Float64Histogram("toolrelay.executor.call.duration", metric.WithUnit("s"),
		metric.WithDescription("How long handlers ran, by function."),
		metric.WithExplicitBucketBoundaries(otelconv.DurationBuckets()...))
	var sets attrcache.Cache
	return func(next Handler) Handler {
		return HandlerFunc(func(ctx context.Context, inv *Invocation) ([]byte, error) {
			start := time.Now()
			out, err := next.Handle(ctx, inv)
			outcome := "ok"
			if err != nil {
				outcome = "error"
			}
			fn := attrFunction.String(inv.Call.Function)
			calls.Add(ctx, 1, sets.Add(fn, attrOutcome.String(outcome))...)
			duration.Record(ctx, time.Since(start).Seconds(), sets.Record(fn)...)
			return out, err
		})
	}
}

// telemetry is what a worker needs beyond the middleware: the process and
// send spans around each message, and the executor's own counters.
type telemetry struct {
	tracer       trace.Tracer
	prop         propagation.TextMapPropagator
	deadLetters  metric.Int64Counter
	redeliveries metric.Int64Counter
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider) *telemetry {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(instrumentation)
	dl, _ := m.Int64Counter("toolrelay.executor.dead_letters", metric.WithDescription("Calls that failed for good, by function and reason."))
	rd, _ := m.Int64Counter("toolrelay.executor.redeliveries", metric.WithDescription("Deliveries beyond the first, by function."))
	return &telemetry{tracer: tp.Tracer(instrumentation), prop: w3c, deadLetters: dl, redeliveries: rd}
}

// process opens the CONSUMER span of a call, parented by the dispatcher's
// send span carried in the message headers.
func (t *telemetry) process(ctx context.Context, name, subject, durable string, header map[string][]string, call *protocol.Call, attempt int, executor string) (context.Context, trace.Span) {
	ctx = t.prop.Extract(ctx, protocol.HeaderCarrier(header))
	ctx, span := t.tracer.Start(ctx, name, otelconv.ConsumerSpan...)
	if !span.IsRecording() {
		return ctx, span
	}
	attrs := make([]attribute.KeyValue, 0, 15) // one allocation, with the call's
	attrs = append(attrs, semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(subject),
		semconv.MessagingDestinationTemplate(protocol.CallSubjectPrefix+".{team}.{function}"),
		semconv.MessagingConsumerGroupName(durable), attrDelivered.Int(attempt), attrExecutor.String(executor))
	if call != nil {
		attrs = append(attrs, semconv.MessagingMessageID(string(call.Key)), attrToolName.String(call.Function),
			attrToolCallID.String(call.CallID), attrTurnKey.String(string(call.Key.Turn())), attrTeam.String(call.Team),
			attrPlatform.String(string(call.Platform)), attrScope.String(call.Scope))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// send opens the PRODUCER span of a result and injects it into header.
func (t *telemetry) send(ctx context.Context, name string, res *protocol.Result, header map[string][]string) trace.Span {
	_, span := t.tracer.Start(ctx, name, otelconv.ProducerSpan...)
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"), semconv.MessagingDestinationName(res.Subject()),
			semconv.MessagingDestinationTemplate(protocol.ResultSubjectPrefix+".{team}.{turn}.{call}"),
			semconv.MessagingMessageID(string(res.Key)), attrToolName.String(res.Function), attrToolCallID.String(res.CallID))
	}
	t.prop.Inject(otelconv.WithSpan(ctx, span), protocol.HeaderCarrier(header))
	return span
}
