package dispatch

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
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

// Trace of a turn (one trace per turn, or a child of the traceparent the
// watch request or webhook carried):
//
//	turn <platform>                         INTERNAL, from intake to submission
//	├── send fncall.{team}.{function}       PRODUCER, one per call
//	│   └── process fncall.{team}.{function}   CONSUMER, in the executor
//	│       ├── execute_tool <function>          the handler
//	│       └── send fnresult.{team}             PRODUCER
//	│           └── process fnresult.{team}        CONSUMER, back in a dispatcher
//	└── submit <platform>                   CLIENT
//
// The turn's context is stored in its record, so whichever replica submits
// parents its spans correctly.

// w3c is the propagation the wire contract fixes, shared with executors.
var w3c = otelconv.Propagator

const instrumentation = "github.com/toolrelay/toolrelay/pkg/dispatch"

// Attribute keys beyond the semantic conventions.
const (
	attrTurnKey    = otelconv.TurnKey
	attrPlatform   = otelconv.Platform
	attrScope      = otelconv.Scope
	attrCalls      = attribute.Key("toolrelay.turn.calls")
	attrCutOff     = attribute.Key("toolrelay.turn.cut_off")
	attrTimeLeft   = attribute.Key("toolrelay.turn.time_left_ms")
	attrOutcome    = otelconv.Outcome
	attrTeam       = otelconv.Team
	attrSessionID  = attribute.Key("toolrelay.session.id")
	attrThreadID   = attribute.Key("toolrelay.thread.id")
	attrRunID      = attribute.Key("toolrelay.run.id")
	attrResponseID = attribute.Key("toolrelay.response.id")
	attrToolName   = otelconv.ToolName
	attrToolCallID = otelconv.ToolCallID
	attrFunction   = otelconv.Function
	attrEventType  = attribute.Key("event_type")
	attrChannel    = attribute.Key("channel")
	attrStartup    = attribute.Key("toolrelay.sweep.startup")
	attrItemType   = attribute.Key("item_type")
)

type telemetry struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	// sets holds the attribute sets of per-call measurements.
	sets attrcache.Cache
	// sendNames and processNames are the span names of calls and results.
	sendNames, processNames, turnNames, submitNames *otelconv.Names

	calls        metric.Int64Counter
	callDuration metric.Float64Histogram
	queueWait    metric.Float64Histogram
	turnDuration metric.Float64Histogram
	timeLeft     metric.Float64Histogram
	cutoffs      metric.Int64Counter
	late         metric.Int64Counter
	passedOn     metric.Int64Counter
	takenOver    metric.Int64Counter
	redeliveries metric.Int64Counter
	webhooks     metric.Int64Counter
	takenIn      metric.Int64Counter
	// unsupported counts items and actions platforms waited on that
	// toolrelay does not serve.
	unsupported metric.Int64Counter
	refused     metric.Int64Counter
	// definitionChanges counts changes of a served function's description
	// or schema (definitions.go).
	definitionChanges metric.Int64Counter
	// sweepDuration is how long each sweep took (sweep.go).
	sweepDuration metric.Float64Histogram
	// approvals counts held calls as they are held and decided
	// (approvals.go).
	approvals metric.Int64Counter

	mu    sync.Mutex
	spans map[protocol.TurnKey]trace.Span

	gaugesMu sync.Mutex
	gauges   gauges
}

func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider, fleet func() []fleetGauge) (*telemetry, error) {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	t := &telemetry{tracer: tp.Tracer(instrumentation), prop: w3c, spans: map[protocol.TurnKey]trace.Span{},
		sendNames:    otelconv.NewNames(func(team, fn string) string { return "send " + protocol.CallSubject(team, fn) }),
		processNames: otelconv.NewNames(func(team, _ string) string { return "process " + protocol.ResultSubjectPrefix + "." + team }),
		turnNames:    otelconv.NewNames(func(platform, _ string) string { return "turn " + platform }),
		submitNames:  otelconv.NewNames(func(platform, _ string) string { return "submit " + platform })}
	m := mp.Meter(instrumentation)
	var err error
	seconds := otelconv.DurationBuckets()
	must := func(e error) {
		if err == nil {
			err = e
		}
	}
	var e error
	t.calls, e = m.Int64Counter("toolrelay.calls", metric.WithDescription("Calls submitted, by function, team and outcome (ok or an error type)."))
	must(e)
	t.callDuration, e = m.Float64Histogram("toolrelay.call.duration", metric.WithUnit("s"),
		metric.WithDescription("How long functions ran, by function and team."), metric.WithExplicitBucketBoundaries(seconds...))
	must(e)
	t.queueWait, e = m.Float64Histogram("toolrelay.call.queue_wait", metric.WithUnit("s"),
		metric.WithDescription("How long calls waited between intake and an executor starting them."), metric.WithExplicitBucketBoundaries(seconds...))
	must(e)
	t.turnDuration, e = m.Float64Histogram("toolrelay.turn.duration", metric.WithUnit("s"),
		metric.WithDescription("From intake to submission, by platform and outcome."), metric.WithExplicitBucketBoundaries(seconds...))
	must(e)
	t.timeLeft, e = m.Float64Histogram("toolrelay.turn.time_left", metric.WithUnit("s"),
		metric.WithDescription("How long before the run expires each turn was submitted: are we making the window?"),
		metric.WithExplicitBucketBoundaries(0, 1, 5, 10, 30, 60, 120, 300, 600))
	must(e)
	t.cutoffs, e = m.Int64Counter("toolrelay.turn.cutoffs", metric.WithDescription("Turns submitted at their deadline without every result."))
	must(e)
	t.late, e = m.Int64Counter("toolrelay.results.late", metric.WithDescription("Results recorded after their turn was submitted."))
	must(e)
	t.passedOn, e = m.Int64Counter("toolrelay.results.passed_on", metric.WithDescription("Turns this replica passed on: news of a turn another replica owns (a result, the deadline) told to the owner, or, as this replica stops, a turn it released told to any other."))
	must(e)
	t.takenOver, e = m.Int64Counter("toolrelay.turns.taken_over", metric.WithDescription("Turns this replica took over once their owner's lease lapsed (the owner died, stopped, or was paused)."))
	must(e)
	t.redeliveries, e = m.Int64Counter("toolrelay.call.redeliveries", metric.WithDescription("Attempts beyond the first, by function."))
	must(e)
	t.webhooks, e = m.Int64Counter("toolrelay.webhooks", metric.WithDescription("Webhooks received, by event type and outcome (accepted, ignored, duplicate, rejected, error)."))
	must(e)
	t.takenIn, e = m.Int64Counter("toolrelay.turns.taken_in", metric.WithDescription("Turns taken in, by platform and by the channel that saw them first (poll, stream, webhook, api)."))
	must(e)
	t.unsupported, e = m.Int64Counter("toolrelay.platform.unsupported", metric.WithDescription("Output items and required actions a platform object waited on (or ended on) that toolrelay does not serve, by platform and item type, each counted once per watch."))
	must(e)
	t.refused, e = m.Int64Counter("toolrelay.registry.refused", metric.WithDescription("Declarations refused, by team and reason (owned_by_other_team, too_many, tool_text, schema, too_large, busy): a team serving a name another owns or one that reads as it, over its quota of declarations or names, whose description or schema text breaks a bound, over a bound of bytes, or whose requests fill its queue at a replica (counted per request)."))
	must(e)
	t.definitionChanges, e = m.Int64Counter("toolrelay.registry.definition_changes", metric.WithDescription("Changes of a function's definition (its description or parameters' schema, what agents read), by team and function: an executor started serving it with another one."))
	must(e)
	t.sweepDuration, e = m.Float64Histogram("toolrelay.sweep.duration", metric.WithUnit("s"),
		metric.WithDescription("How long each sweep of the open turns took on this replica; startup marks the one at start, which re-arms what a restart left open."),
		metric.WithExplicitBucketBoundaries(seconds...))
	must(e)
	t.approvals, e = m.Int64Counter("toolrelay.approvals", metric.WithDescription("Calls held for a person's approval, by team, function and outcome: requested when held, then approved, denied or expired (denied automatically, not decided in time)."))
	must(e)
	must(t.observe(m, fleet))
	return t, err
}

// gaugeInterval is how often Run refreshes the figures the gauges report:
// a scrape reads the cache, so scrapes cost JetStream nothing however many
// replicas are scraped and however often.
const gaugeInterval = 5 * time.Second

// gauges are the figures read from JetStream for the observable gauges.
type gauges struct {
	openTurns   int64
	haveOpen    bool
	functions   []functionGauge
	deadLetters []functionGauge
	refreshedAt time.Time
}

type functionGauge struct {
	team, function  string
	queued, running int64
}

// observe registers the gauges of JetStream state: open turns, calls
// queued and running per function, dead letters. They report the figures
// refreshGauges last read.
func (t *telemetry) observe(m metric.Meter, fleet func() []fleetGauge) error {
	openTurns, err := m.Int64ObservableGauge("toolrelay.turns.open", metric.WithDescription("Turns taken in and not yet submitted (all replicas)."))
	if err != nil {
		return err
	}
	lag, err := m.Int64ObservableGauge("toolrelay.calls.queued", metric.WithDescription("Calls waiting for an executor, by team and function (consumer lag)."))
	if err != nil {
		return err
	}
	running, err := m.Int64ObservableGauge("toolrelay.calls.in_flight", metric.WithDescription("Calls delivered to executors and not yet acknowledged, by team and function."))
	if err != nil {
		return err
	}
	dead, err := m.Int64ObservableGauge("toolrelay.dead_letters", metric.WithDescription("Dead letters kept, by team and function."))
	if err != nil {
		return err
	}
	executors, err := m.Int64ObservableGauge("toolrelay.function.executors", metric.WithDescription("Executor processes serving each function now (live declarations), by team and function."))
	if err != nil {
		return err
	}
	schemas, err := m.Int64ObservableGauge("toolrelay.function.schemas", metric.WithDescription("Distinct schemas the live executors of each function declare; more than 1 means they disagree."))
	if err != nil {
		return err
	}
	_, err = m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		t.gaugesMu.Lock()
		g := t.gauges
		t.gaugesMu.Unlock()
		if g.haveOpen {
			o.ObserveInt64(openTurns, g.openTurns)
		}
		for _, f := range g.functions {
			attrs := metric.WithAttributes(attrTeam.String(f.team), attrFunction.String(f.function))
			o.ObserveInt64(lag, f.queued, attrs)
			o.ObserveInt64(running, f.running, attrs)
		}
		for _, f := range g.deadLetters {
			o.ObserveInt64(dead, f.queued, metric.WithAttributes(attrTeam.String(f.team), attrFunction.String(f.function)))
		}
		for _, f := range fleet() {
			attrs := metric.WithAttributes(attrTeam.String(f.team), attrFunction.String(f.function))
			o.ObserveInt64(executors, f.executors, attrs)
			o.ObserveInt64(schemas, f.schemas, attrs)
		}
		return nil
	}, openTurns, lag, running, dead, executors, schemas)
	return err
}

// refreshGauges reads the gauges' figures from JetStream. A figure it
// cannot read keeps its last value.
func (d *Dispatcher) refreshGauges(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, gaugeInterval)
	defer cancel()
	t := d.tel
	t.gaugesMu.Lock()
	g := t.gauges
	t.gaugesMu.Unlock()
	// Counted from the timer index, without listing it (which at 100k open
	// turns is megabytes every refresh): each open turn has one subject
	// there, and a turn closed in the last second or so still has its
	// markers, so it counts a moment longer.
	if info, err := d.timers.Info(ctx); err == nil {
		g.openTurns, g.haveOpen = int64(info.State.NumSubjects), true
	}
	var fns, dls []functionGauge
	for _, team := range d.Teams() {
		js, err := d.TeamJetStream(team)
		if err != nil {
			continue
		}
		q, err := queueFigures(ctx, js, team)
		if err != nil {
			d.log.DebugContext(ctx, "reading a team's queue figures failed", "team", team, "err", err)
			q = ofTeam(g.functions, team)
		}
		fns = append(fns, q...)
		l, err := deadLetterFigures(ctx, js, team)
		if err != nil {
			d.log.DebugContext(ctx, "reading a team's dead-letter figures failed", "team", team, "err", err)
			l = ofTeam(g.deadLetters, team)
		}
		dls = append(dls, l...)
	}
	g.functions, g.deadLetters = fns, dls
	g.refreshedAt = time.Now()
	t.gaugesMu.Lock()
	t.gauges = g
	t.gaugesMu.Unlock()
}

// queueFigures reads team's functions' calls waiting (consumer lag) and
// delivered but not acknowledged, from the consumers of its call stream on
// js (the team's account). A team whose executors made no call stream yet
// has no figures.
func queueFigures(ctx context.Context, js jetstream.JetStream, team string) ([]functionGauge, error) {
	s, err := optionalStream(ctx, js, protocol.CallStream(team))
	if s == nil || err != nil {
		return nil, err
	}
	var out []functionGauge
	infos := s.ListConsumers(ctx)
	for ci := range infos.Info() {
		out = append(out, functionGauge{team: team, function: ci.Name, queued: int64(ci.NumPending), running: int64(ci.NumAckPending)})
	}
	return out, infos.Err()
}

// deadLetterFigures counts the dead letters of team's functions from the
// subjects of the dead-letter stream on js (the team's account): each
// call's records share one subject (fndlq.<team>.<function>.<call key>),
// which counts as one dead letter however often it was replayed; records
// of the layout before that (fndlq.<team>.<function>) count one each.
func deadLetterFigures(ctx context.Context, js jetstream.JetStream, team string) ([]functionGauge, error) {
	s, err := optionalStream(ctx, js, protocol.DeadLetterStream)
	if s == nil || err != nil {
		return nil, err
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(protocol.DeadLetterSubjectPrefix+"."+team+".>"))
	if err != nil {
		return nil, err
	}
	byFunction := map[string]int64{}
	for subj, n := range info.State.Subjects {
		switch parts := strings.SplitN(subj, ".", 4); len(parts) {
		case 3:
			byFunction[parts[2]] += int64(n)
		case 4:
			byFunction[parts[2]]++
		}
	}
	out := make([]functionGauge, 0, len(byFunction))
	for fn, n := range byFunction {
		out = append(out, functionGauge{team: team, function: fn, queued: n})
	}
	return out, nil
}

// optionalStream returns the stream name on js, or nil when it does not
// exist (yet: a team's executors create theirs).
func optionalStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	return s, err
}

// ofTeam returns the figures of team among fs.
func ofTeam(fs []functionGauge, team string) []functionGauge {
	return slices.DeleteFunc(slices.Clone(fs), func(f functionGauge) bool { return f.team != team })
}

// startTurn opens the turn's span as a child of ctx and stores its context
// in the record; keepTurn holds it until the turn closes.
func (t *telemetry) startTurn(ctx context.Context, turn *Turn) (context.Context, trace.Span) {
	ctx, span := t.tracer.Start(ctx, t.turnNames.Get(string(turn.Ref.Platform), ""))
	if span.IsRecording() {
		span.SetAttributes(append(refAttrs(turn.Ref), attrTurnKey.String(string(turn.Key)), attrPlatform.String(string(turn.Ref.Platform)),
			attrScope.String(turn.Scope), attrCalls.Int(len(turn.Calls)))...)
	}
	if span.SpanContext().IsValid() {
		t.prop.Inject(ctx, &turn.Trace)
	}
	return ctx, span
}

func (t *telemetry) keepTurn(key protocol.TurnKey, span trace.Span) {
	if !span.IsRecording() {
		return
	}
	t.mu.Lock()
	t.spans[key] = span
	t.mu.Unlock()
}

func refAttrs(r Ref) []attribute.KeyValue {
	var a []attribute.KeyValue
	add := func(k attribute.Key, v string) {
		if v != "" {
			a = append(a, k.String(v))
		}
	}
	add(attrSessionID, r.SessionID)
	add(attrThreadID, r.ThreadID)
	add(attrRunID, r.RunID)
	add(attrResponseID, r.ResponseID)
	return a
}

// turnContext is ctx carrying the turn's span context, on any replica.
func (t *telemetry) turnContext(ctx context.Context, turn *Turn) context.Context {
	if turn.Trace.IsZero() {
		return ctx
	}
	return t.prop.Extract(ctx, &turn.Trace)
}

// endTurn ends the turn's span if this replica opened it.
func (t *telemetry) endTurn(key protocol.TurnKey, state TurnState, reason string) {
	t.endTurnOutcome(key, string(state), state == TurnFailed, reason)
}

func (t *telemetry) endTurnOutcome(key protocol.TurnKey, outcome string, failed bool, reason string) {
	t.mu.Lock()
	span := t.spans[key]
	delete(t.spans, key)
	t.mu.Unlock()
	if span == nil {
		return
	}
	span.SetAttributes(attrOutcome.String(outcome))
	if failed {
		span.SetStatus(codes.Error, reason)
	}
	span.End()
}

// endAll ends the spans of turns still open when the dispatcher stops.
func (t *telemetry) endAll() {
	t.mu.Lock()
	spans := t.spans
	t.spans = map[protocol.TurnKey]trace.Span{}
	t.mu.Unlock()
	for _, s := range spans {
		s.SetAttributes(attrOutcome.String("unfinished"))
		s.AddEvent("dispatcher stopped before the turn closed; another replica finishes it")
		s.End()
	}
}

// send opens the PRODUCER span of a call and injects it into the message.
func (t *telemetry) send(ctx context.Context, c *TurnCall, header map[string][]string, size int) trace.Span {
	_, span := t.tracer.Start(ctx, t.sendNames.Get(c.Team, c.Name), otelconv.ProducerSpan...)
	if span.IsRecording() {
		subject := protocol.CallSubject(c.Team, c.Name)
		span.SetAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeSend,
			semconv.MessagingOperationName("publish"), semconv.MessagingDestinationName(subject),
			semconv.MessagingDestinationTemplate(protocol.CallSubjectPrefix+".{team}.{function}"),
			semconv.MessagingMessageID(string(c.Key)), semconv.MessagingMessageBodySize(size),
			attrToolName.String(c.Name), attrToolCallID.String(c.ID), attrTeam.String(c.Team))
	}
	t.prop.Inject(otelconv.WithSpan(ctx, span), protocol.HeaderCarrier(header))
	return span
}

// processResult opens the CONSUMER span of a result, parented by the
// executor's send span carried in the message.
func (t *telemetry) processResult(ctx context.Context, subject, team string, header map[string][]string, res *protocol.Result) (context.Context, trace.Span) {
	ctx = t.prop.Extract(ctx, protocol.HeaderCarrier(header))
	ctx, span := t.tracer.Start(ctx, t.processNames.Get(team, ""), otelconv.ConsumerSpan...)
	if !span.IsRecording() {
		return ctx, span
	}
	attrs := make([]attribute.KeyValue, 0, 11) // one allocation, with the result's
	attrs = append(attrs, semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(subject),
		semconv.MessagingDestinationTemplate(protocol.ResultSubjectPrefix+".{team}.{turn}.{call}"),
		semconv.MessagingConsumerGroupName(resultsConsumer), attrTeam.String(team))
	if res != nil {
		attrs = append(attrs, semconv.MessagingMessageID(string(res.Key)), attrToolName.String(res.Function),
			attrToolCallID.String(res.CallID), attrTurnKey.String(string(res.Key.Turn())))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// result records the metrics a result carries.
func (t *telemetry) result(ctx context.Context, turn *Turn, res *protocol.Result) {
	if !res.StartedAt.IsZero() {
		fn := t.sets.Record(attrFunction.String(res.Function), attrTeam.String(res.Team))
		t.callDuration.Record(ctx, res.FinishedAt.Sub(res.StartedAt).Seconds(), fn...)
		t.queueWait.Record(ctx, max(res.StartedAt.Sub(turn.CreatedAt), 0).Seconds(), fn...)
	}
	if res.Attempt > 1 {
		t.redeliveries.Add(ctx, int64(res.Attempt-1), metric.WithAttributes(attrFunction.String(res.Function)))
	}
}

// submitted records the metrics of a closed turn.
func (t *telemetry) submitted(ctx context.Context, turn *Turn, outputs []Output, state TurnState, at time.Time) {
	p := attrPlatform.String(string(turn.Ref.Platform))
	t.turnDuration.Record(ctx, at.Sub(turn.CreatedAt).Seconds(), t.sets.Record(p, attrOutcome.String(string(state)))...)
	if state == TurnSubmitted {
		t.timeLeft.Record(ctx, max(turn.ExpiresAt.Sub(at), 0).Seconds(), t.sets.Record(p)...)
	}
	if turn.Outcome().CutOff {
		t.cutoffs.Add(ctx, 1, metric.WithAttributes(p))
	}
	for _, o := range outputs {
		outcome := "ok"
		if o.Result.Error != nil {
			outcome = string(o.Result.Error.Code)
		}
		t.calls.Add(ctx, 1, t.sets.Add(attrFunction.String(metricFunction(&o.Call)), attrTeam.String(o.Call.Team), attrOutcome.String(outcome))...)
	}
}

// unknownFunction is the function label of calls to functions no team
// serves: the model can invent any name, and each must not become a label
// value of its own.
const unknownFunction = "unknown"

// metricFunction is the function label of a call: its name once intake
// found the function's owning team, else unknownFunction.
func metricFunction(c *TurnCall) string {
	if c.Team == "" || c.Team == protocol.SystemTeam {
		return unknownFunction
	}
	return c.Name
}
