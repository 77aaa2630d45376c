package dispatch

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Defaults of Options, used where a field is zero. The dispatcher command's
// settings default to the same values (a test checks).
const (
	DefaultSubmitMargin         = 30 * time.Second
	DefaultRunTTL               = 10 * time.Minute
	DefaultMaxSteps             = 16
	DefaultPollInterval         = 200 * time.Millisecond
	DefaultShutdownTimeout      = 10 * time.Second
	DefaultServeGrace           = 3 * time.Second
	DefaultMaxInFlightPublishes = 4096
	DefaultMaxInFlightPerTeam   = 1024
	DefaultSweepInterval        = 10 * time.Second
	// DefaultMaxDeclarationsPerTeam bounds the live declarations (one per
	// function and executor process) a team may have at once.
	DefaultMaxDeclarationsPerTeam = 4096
	// DefaultMaxRegistryBytesPerTeam bounds the bytes of a team's live
	// declarations and claims in the registry.
	DefaultMaxRegistryBytesPerTeam = 8 << 20
	// DefaultClaimGrace is how long a team keeps a function name after
	// its last executor of it stops.
	DefaultClaimGrace = time.Hour
	// DefaultDeclareQueuePerTeam bounds the declare requests of one team
	// waiting at one replica.
	DefaultDeclareQueuePerTeam = 64
)

// Options configures a Dispatcher. The zero value is valid.
type Options struct {
	// Logger receives the dispatcher's logs. Default: slog.Default().
	Logger *slog.Logger
	// Name identifies this replica in turn records and logs.
	// Default: "<hostname>-<random>".
	Name string
	// SubmitMargin is how long before a run expires the dispatcher submits
	// whatever it has. For runs shorter than four margins it is a quarter
	// of the time left, so short runs still leave their functions time.
	// Default: 30s.
	SubmitMargin time.Duration
	// RunTTL is the expiry assumed where the platform gives none (Agents
	// sessions, Responses), counted from when the dispatcher first sees the
	// required action. Default: 10m.
	RunTTL time.Duration
	// MaxSteps bounds how many turns one watch drives (Responses chains);
	// the attached WatchDriver reads it. Default: 16.
	MaxSteps int
	// PollInterval is the first delay between polls of a watched object; it
	// grows to 5s while the object is unchanged (the attached WatchDriver
	// reads it). Default: 200ms.
	PollInterval time.Duration
	// Replicas of the streams and buckets the dispatcher creates. Default: 1.
	Replicas int
	// ServeGrace is how long intake waits for an executor to serve a
	// function nobody serves (none pulling, none working) before failing
	// its calls as unavailable; and how long the calls already waiting for
	// a function whose last executor went wait for one to come back before
	// they fail as unavailable (orphans.go). Default: 3s.
	ServeGrace time.Duration
	// MaxInFlightPublishes bounds the calls being published at once, and
	// MaxInFlightPerTeam any one team's share of them, so one team's burst
	// cannot starve the others. Defaults: 4096 and 1024.
	MaxInFlightPublishes int
	MaxInFlightPerTeam   int
	// SweepInterval is how often each replica looks for turns and watches
	// left by a replica that died mid-way, and takes them up.
	// Default: 10s.
	SweepInterval time.Duration
	// ResultStreamBytes bounds each team's result stream, so one team's
	// flood fills only its own. Default: protocol.DefaultResultStreamBytes.
	ResultStreamBytes int64
	// MaxDeclarationsPerTeam bounds a team's live declarations, and the
	// function names it owns; more are refused, before any name is
	// claimed. Default: DefaultMaxDeclarationsPerTeam.
	MaxDeclarationsPerTeam int
	// MaxRegistryBytesPerTeam bounds the bytes a team's live declarations
	// and claims take in the registry; a declaration that would take more
	// is refused. Default: DefaultMaxRegistryBytesPerTeam (8 MiB).
	MaxRegistryBytesPerTeam int64
	// ClaimGrace is how long a team keeps a function name no executor of
	// it serves; then any replica releases the name (release.go).
	// Default: DefaultClaimGrace (1h).
	ClaimGrace time.Duration
	// DeclareQueuePerTeam bounds the declare requests of one team waiting
	// at a replica; more are answered at once as busy, and sent again by
	// the executor. Each team's requests are taken in by its own worker,
	// renewals first (declarequeue.go). Default:
	// DefaultDeclareQueuePerTeam.
	DeclareQueuePerTeam int
	// DefinitionApproval holds a changed description or schema of a
	// served function back from agents until an admin accepts it (POST
	// /v1/functions/{name}/accept): tools/list and GET /v1/tools show the
	// definition last accepted meanwhile. Default: false, a change reaches
	// agents at once (and is logged, counted and shown).
	DefinitionApproval bool
	// ShutdownTimeout is how long Run waits, once its context ends, for
	// submissions in progress before cancelling them (another replica, or
	// this one restarted, then repeats them). Default: 10s.
	ShutdownTimeout time.Duration
	// OnEvent, if set, is called after each turn is taken in, submitted or
	// failed. It must not block.
	OnEvent func(Event)
	// Webhooks verifies POST /webhooks/openai (for OpenAI's signed
	// webhooks: openaiplatform.Webhooks(secret)). Nil: every webhook gets
	// 401.
	Webhooks WebhookVerifier
	// TeamAPIPrefix is where the dispatcher reaches each team's account's
	// JetStream API, "{team}" standing for the team: the read-only paths
	// of a deployment with an account per team (dispatcher nats-config:
	// protocol.TeamAPIPrefixTemplate), through which it reads the teams'
	// queue figures and which the console reads dead letters through
	// (see TeamJetStream). Default: empty, the teams' streams are in js's
	// own account.
	TeamAPIPrefix string
	// AuditRetention is how long the audit trail (approval requests,
	// decisions, runs of side-effecting functions) keeps an entry.
	// Default: DefaultAuditRetention (90 days).
	AuditRetention time.Duration
	// AuditBytes bounds the audit trail's storage; when full, the oldest
	// entries go first. Default: DefaultAuditBytes (1 GiB).
	AuditBytes int64
	// MCPServerLabels are the server_label values under which agents are
	// given this fleet's own /mcp: an MCP approval request under one of
	// them names a function, and its approval policy decides it; any
	// other server's requests wait for an admin (mcpapproval.go).
	// Default: DefaultMCPServerLabels.
	MCPServerLabels []string
	// ApprovalWebhookURL, if set, receives a POST of each call held for
	// approval (its record, as announced on NATS), signed with
	// ApprovalWebhookSecret as Standard Webhooks are ("whsec_" and the
	// key in base64, or the key). Default: none (approvalhook.go).
	ApprovalWebhookURL    string
	ApprovalWebhookSecret string
	// TracerProvider and MeterProvider receive the dispatcher's spans and
	// metrics. Default: the OpenTelemetry globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
}

// Event reports a step in a turn's life.
type Event struct {
	Kind EventKind
	Turn *Turn
	// Latency is from intake to submission (TurnSubmitted, TurnFailed).
	Latency time.Duration
	// TimeLeft is how long before expiry the turn was submitted.
	TimeLeft time.Duration
}

// EventKind names an Event.
type EventKind int

// Event kinds.
const (
	EventTurnStarted EventKind = iota
	EventTurnSubmitted
	EventTurnFailed
)

// Dispatcher turns required actions into calls on JetStream, gathers their
// results and submits each turn once, before its run expires. Many replicas
// may share one NATS: each turn is submitted by the replica that wins its
// compare-and-set.
type Dispatcher struct {
	js jetstream.JetStream
	// async publishes the writes a turn waits for together (its record,
	// timer and calls). It lives as long as js's connection, as
	// jetstream's own publisher does: intakes from handlers Run does not
	// wait for may still be under way when Run returns.
	async     *jspub.Async
	platforms map[protocol.Platform]Platform
	opts      Options
	log       *slog.Logger

	turns   turnStore
	open    jetstream.KeyValue
	watches jetstream.KeyValue
	// webhooksSeen backs the webhook intake.
	webhooksSeen jetstream.KeyValue
	// steps backs stepOf (Agents sessions).
	steps jetstream.KeyValue
	// tasks indexes started calls by their client (StartedCalls).
	tasks jetstream.KeyValue
	// approvals holds the calls held for a decision (approvals.go);
	// audits is the audit trail (audit.go).
	approvals jetstream.KeyValue
	// hook sends the approval webhook; nil without one (approvalhook.go).
	hook     *approvalHook
	audits   jetstream.Stream
	timers   jetstream.Stream
	registry *registry
	gather   *gatherer
	limiter  *limiter
	tel      *telemetry
	inspect  *inspector // what the inspection API and the console read
	teamAPIs *teamAPIs

	ready   atomic.Bool
	running atomic.Bool
	// spawn runs background work (watch drivers) under Run's lifetime.
	spawnMu sync.Mutex
	spawn   func(func(context.Context))
	runCtx  context.Context

	// watchDriver drives this replica's watches (AttachWatchDriver).
	watchDriver atomic.Pointer[attached]
	// instance is this process in the turns' leases: its name and an ID
	// of its own, since two processes may share a name.
	instance string
	// engine decides, for the turns this process works on, who submits
	// them and when (docs/turns.md).
	engine *lifecycle.Engine

	// lastSweep is when the last sweep began; only the sweep loop uses it.
	lastSweep time.Time
	// recent holds the turns closed here a moment ago, which the sweep
	// need not read.
	recent *recentlyClosed
	// closing tells the waits in this process of the turns it closes.
	closing closeNotices
	// calls are the direct calls with a handle running here, which a
	// cancellation told to every replica ends.
	calls runningCalls

	// unavailableFor is how long requests wait for JetStream to come back
	// before answering that it is unavailable.
	unavailableFor time.Duration
}

// New returns a dispatcher for the given platforms on js.
func New(js jetstream.JetStream, platforms []Platform, opts Options) (*Dispatcher, error) {
	if js == nil {
		return nil, errors.New("dispatch: a JetStream context is required")
	}
	// Turn records and steps are written to their bucket's own subject
	// ($KV.<bucket>.<key>), where the buckets of the connection's account
	// live; through another domain or API prefix those writes would miss.
	if o := js.Options(); o.Domain != "" || (o.APIPrefix != "" && o.APIPrefix != jetstream.DefaultAPIPrefix) {
		return nil, fmt.Errorf("dispatch: the JetStream context must be the account's own (domain %q, API prefix %q given)", o.Domain, o.APIPrefix)
	}
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	if opts.Name == "" {
		host, _ := os.Hostname()
		opts.Name = host + "-" + uuid.NewString()[:8]
	}
	opts.SubmitMargin = cmp.Or(max(opts.SubmitMargin, 0), DefaultSubmitMargin)
	opts.RunTTL = cmp.Or(max(opts.RunTTL, 0), DefaultRunTTL)
	opts.MaxSteps = cmp.Or(max(opts.MaxSteps, 0), DefaultMaxSteps)
	opts.PollInterval = cmp.Or(max(opts.PollInterval, 0), DefaultPollInterval)
	opts.ShutdownTimeout = cmp.Or(max(opts.ShutdownTimeout, 0), DefaultShutdownTimeout)
	opts.ServeGrace = cmp.Or(max(opts.ServeGrace, 0), DefaultServeGrace)
	opts.MaxInFlightPublishes = cmp.Or(max(opts.MaxInFlightPublishes, 0), DefaultMaxInFlightPublishes)
	opts.MaxInFlightPerTeam = cmp.Or(max(opts.MaxInFlightPerTeam, 0), DefaultMaxInFlightPerTeam)
	opts.SweepInterval = cmp.Or(max(opts.SweepInterval, 0), DefaultSweepInterval)
	opts.ResultStreamBytes = cmp.Or(max(opts.ResultStreamBytes, 0), protocol.DefaultResultStreamBytes)
	opts.MaxDeclarationsPerTeam = cmp.Or(max(opts.MaxDeclarationsPerTeam, 0), DefaultMaxDeclarationsPerTeam)
	opts.MaxRegistryBytesPerTeam = cmp.Or(max(opts.MaxRegistryBytesPerTeam, 0), DefaultMaxRegistryBytesPerTeam)
	opts.ClaimGrace = cmp.Or(max(opts.ClaimGrace, 0), DefaultClaimGrace)
	opts.DeclareQueuePerTeam = cmp.Or(max(opts.DeclareQueuePerTeam, 0), DefaultDeclareQueuePerTeam)
	opts.AuditRetention = cmp.Or(max(opts.AuditRetention, 0), DefaultAuditRetention)
	opts.AuditBytes = cmp.Or(max(opts.AuditBytes, 0), DefaultAuditBytes)
	if len(opts.MCPServerLabels) == 0 {
		opts.MCPServerLabels = DefaultMCPServerLabels
	}
	for _, l := range opts.MCPServerLabels {
		if l == "" || len(l) > maxMCPNameLength || strings.TrimSpace(l) != l {
			return nil, fmt.Errorf("dispatch: MCP server label %q: want 1 to %d characters, without surrounding spaces", l, maxMCPNameLength)
		}
	}
	hook, err := newApprovalHook(opts.ApprovalWebhookURL, opts.ApprovalWebhookSecret)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{js: js, hook: hook, async: jspub.NewAsync(js.Conn(), asyncMaxPending, ackTimeout), recent: newRecentlyClosed(recentlyClosedFor), opts: opts,
		log: opts.Logger.With("dispatcher", opts.Name), platforms: map[protocol.Platform]Platform{}, unavailableFor: unavailableRetryFor}
	for _, p := range platforms {
		if _, dup := d.platforms[p.Name()]; dup {
			return nil, fmt.Errorf("dispatch: two adapters for platform %s", p.Name())
		}
		d.platforms[p.Name()] = p
	}
	if _, ok := d.platforms[protocol.PlatformMCP]; !ok {
		d.platforms[protocol.PlatformMCP] = mcpPlatform{}
	}
	teamAPIs, err := newTeamAPIs(js, opts.TeamAPIPrefix)
	if err != nil {
		return nil, err
	}
	d.teamAPIs = teamAPIs
	d.registry = newRegistry(d.log)
	tel, err := newTelemetry(opts.TracerProvider, opts.MeterProvider, d.registry.fleet)
	if err != nil {
		return nil, fmt.Errorf("dispatch: telemetry: %w", err)
	}
	d.tel = tel
	d.gather = newGatherer(d)
	d.limiter = newLimiter(opts.MaxInFlightPublishes, opts.MaxInFlightPerTeam)
	d.instance = opts.Name + "/" + uuid.NewString()[:12]
	d.registry.by = d.instance
	d.engine = lifecycle.New(d.instance, turnEnv{d}, d.log)
	d.inspect = newInspector(d)
	return d, nil
}

// Ready reports whether Run has provisioned everything and is consuming.
func (d *Dispatcher) Ready() bool { return d.ready.Load() }

// Connected reports whether the dispatcher's NATS connection is up now.
func (d *Dispatcher) Connected() bool { return d.js.Conn().Status() == nats.CONNECTED }

// Run provisions streams and buckets, resumes open turns (and, through
// the attached WatchDriver, watches), and serves until ctx ends; then it stops consuming and waits for submissions
// in progress. It returns an error only if it cannot start.
func (d *Dispatcher) Run(ctx context.Context) error {
	if !d.running.CompareAndSwap(false, true) {
		return errors.New("dispatch: Run called twice")
	}
	// A dispatcher started with its servers waits for JetStream to answer.
	err := jsretry.UntilReady(ctx, d.log, "provisioning", d.provision)
	if ctx.Err() != nil {
		return nil // stopped while starting: a clean stop
	}
	if err != nil {
		return err
	}

	// Consumers, watches and refreshers run under rctx, which ends with ctx
	// or as soon as Run returns (a startup error returns at once). Background
	// work (submissions, watch drivers) runs under bctx: once ctx ends it may
	// finish for up to ShutdownTimeout, so that a submission in flight is not
	// cut off by a routine restart; then it is cancelled and left to another
	// replica or the restart.
	var wg sync.WaitGroup
	rctx, stopRun := context.WithCancel(ctx)
	bctx, cancelBackground := context.WithCancelCause(context.WithoutCancel(ctx))
	pool := newWorkers(bctx, &wg)
	d.spawnMu.Lock()
	d.spawn = pool.run
	d.runCtx = rctx
	d.spawnMu.Unlock()
	defer func() {
		stopRun()
		d.spawnMu.Lock() // no new background work once stopping
		d.spawn = nil
		d.spawnMu.Unlock()
		pool.stop()
		d.drain(&wg, cancelBackground)
		// The turns still open now, none closed during the drain, are
		// left to another replica or the restart.
		d.tel.endAll()
	}()

	regReady := make(chan struct{})
	wg.Go(func() { d.registry.follow(rctx, regReady) })
	regWait := time.NewTimer(registryLoadWait)
	select {
	case <-regReady:
	case <-regWait.C:
		d.log.Warn("registry not loaded in time; reading it on demand", "after", registryLoadWait.String())
	case <-ctx.Done():
	}
	regWait.Stop()
	if ctx.Err() != nil {
		return nil
	}

	// The consumers are looked up or created as JetStream answers: a
	// replica restarted while a server is down or a leader is being
	// elected waits for it, as provisioning does, instead of exiting.
	whenReady := func(what string, start func(context.Context) (func(), error)) (stop func(), err error) {
		err = jsretry.UntilReady(rctx, d.log, what, func(ctx context.Context) (err error) {
			stop, err = start(ctx)
			return err
		})
		return stop, err
	}
	stopResults, err := whenReady("starting to gather results", d.gather.start)
	if err != nil {
		return fmt.Errorf("dispatch: gather results: %w", err)
	}
	if stopResults == nil {
		return nil // stopped while starting
	}
	stopResults = sync.OnceFunc(stopResults) // stopped before leases are released, or on a startup error
	defer stopResults()
	stopTimers, err := whenReady("starting to consume deadline timers", d.startTimers)
	if err != nil {
		return fmt.Errorf("dispatch: consume deadline timers: %w", err)
	}
	if stopTimers == nil {
		return nil
	}
	defer stopTimers()
	stopApprovalTimers, err := whenReady("starting to consume auto-deny timers", d.startApprovalTimers)
	if err != nil {
		return fmt.Errorf("dispatch: consume auto-deny timers: %w", err)
	}
	if stopApprovalTimers == nil {
		return nil
	}
	defer stopApprovalTimers()

	if w := d.driver(); w != nil {
		stopWatches, err := w.Serve(rctx)
		if err != nil {
			return fmt.Errorf("dispatch: serve the watch driver: %w", err)
		}
		defer stopWatches()
	}
	stopCallCancels, err := d.serveCallCancels()
	if err != nil {
		return fmt.Errorf("dispatch: hear of cancelled direct calls: %w", err)
	}
	defer stopCallCancels()
	stopHandovers, stopTells, err := d.serveTells()
	if err != nil {
		return fmt.Errorf("dispatch: hear of the turns this replica owns: %w", err)
	}
	// Once no result comes any more, the leases this replica holds are
	// released and handed to the others, so that they need not wait them
	// out; it still hears, meanwhile, of the turns it owns.
	defer func() {
		stopResults()
		stopHandovers()
		d.releaseAll()
		stopTells()
	}()
	stopDeclarations, err := d.serveDeclarations(rctx)
	if err != nil {
		return fmt.Errorf("dispatch: serve executors' declarations: %w", err)
	}
	defer stopDeclarations()
	wg.Go(func() { d.refreshGaugesEvery(rctx, gaugeInterval) })
	if d.hook != nil {
		wg.Go(func() { d.hook.run(rctx, d) })
	}
	d.resume(bctx)
	d.ready.Store(true)
	d.log.InfoContext(ctx, "dispatcher ready", "platforms", len(d.platforms))
	<-ctx.Done()
	d.ready.Store(false)
	d.log.InfoContext(ctx, "dispatcher stopping: no new work; open turns are left to other replicas or the restart")
	return nil
}

// provision creates (or checks) the streams and buckets the dispatchers
// own: turn state, timers, watches, the registry and the teams' result
// streams (those as teams appear). What a team's executors keep in their own
// account (calls, cancellations, dead letters, attempt marks) they create.
func (d *Dispatcher) provision(ctx context.Context) error {
	popts := provision.Options{Replicas: d.opts.Replicas}
	var err error
	if d.timers, err = provision.Stream(ctx, d.js, provision.TimerStreamConfig(popts)); err != nil {
		return err
	}
	kv, err := provision.KeyValue(ctx, d.js, provision.TurnBucketConfig(popts))
	if err != nil {
		return err
	}
	d.turns = turnStore{kv: kv, nc: d.js.Conn()}

	if d.watches, err = provision.KeyValue(ctx, d.js, provision.WatchBucketConfig(popts)); err != nil {
		return err
	}
	if d.webhooksSeen, err = provision.KeyValue(ctx, d.js, provision.WebhookBucketConfig(popts)); err != nil {
		return err
	}
	// The watch driver's index of the responses it drives.
	if _, err = provision.KeyValue(ctx, d.js, provision.ResponseBucketConfig(popts)); err != nil {
		return err
	}
	if d.steps, err = provision.KeyValue(ctx, d.js, provision.StepBucketConfig(popts)); err != nil {
		return err
	}
	if d.tasks, err = provision.KeyValue(ctx, d.js, provision.TaskBucketConfig(popts)); err != nil {
		return err
	}
	if d.approvals, err = provision.KeyValue(ctx, d.js, provision.ApprovalBucketConfig(popts)); err != nil {
		return err
	}
	if d.audits, err = provisionAudit(ctx, d.js, d.opts.AuditRetention, d.opts.AuditBytes, popts); err != nil {
		return err
	}
	if d.registry.claims, err = provision.KeyValue(ctx, d.js, provision.RegistryBucketConfig(popts)); err != nil {
		return err
	}
	if d.registry.decls, err = provision.KeyValue(ctx, d.js, provision.DeclarationBucketConfig(popts)); err != nil {
		return err
	}
	if d.registry.names, err = provision.KeyValue(ctx, d.js, provision.NameBucketConfig(popts)); err != nil {
		return err
	}
	return nil
}

// registryLoadWait bounds how long Run waits for the registry's first
// snapshot before serving (it reads entries on demand meanwhile).
const registryLoadWait = 10 * time.Second

// drain waits for background work (submissions in progress) for up to
// ShutdownTimeout, then cancels what is left with errShutdown and waits for
// it to return. Anything cancelled is repeated by another replica's sweep
// or this one's restart.
func (d *Dispatcher) drain(wg *sync.WaitGroup, cancel context.CancelCauseFunc) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timeout := time.NewTimer(d.opts.ShutdownTimeout)
	defer timeout.Stop()
	select {
	case <-done:
	case <-timeout.C:
		d.log.Warn("shutdown timeout: cancelling submissions in progress; another replica or the restart repeats them",
			"timeout", d.opts.ShutdownTimeout.String())
	}
	cancel(errShutdown)
	<-done
}

// refreshGaugesEvery refreshes the gauges' figures until ctx ends.
func (d *Dispatcher) refreshGaugesEvery(ctx context.Context, every time.Duration) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		d.refreshGauges(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// withRunContext derives a context that also ends when Run's context
// does: for background work that should stop at once on shutdown (polling,
// waiting), unlike submissions.
func (d *Dispatcher) withRunContext(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	d.spawnMu.Lock()
	run := d.runCtx
	d.spawnMu.Unlock()
	if run == nil { // Run has not started: nothing to end with
		return ctx, cancel
	}
	stop := context.AfterFunc(run, cancel)
	return ctx, func() { stop(); cancel() }
}

// detached returns a context with ctx's values that ends when Run stops
// rather than when ctx does: for work that must finish once begun, whoever
// asked for it (a recorded turn's calls going out while the webhook that
// brought it closes its connection). Without Run it never ends.
func (d *Dispatcher) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return d.withRunContext(context.WithoutCancel(ctx))
}

// errShutdown cancels background work still running ShutdownTimeout after
// Run's context ended.
var errShutdown = errors.New("dispatch: dispatcher shut down")

// background runs f under Run's lifetime; it reports false if Run is not
// running.
func (d *Dispatcher) background(f func(context.Context)) bool {
	d.spawnMu.Lock()
	defer d.spawnMu.Unlock()
	if d.spawn == nil {
		return false
	}
	d.spawn(f)
	return true
}

// resume sweeps once at start (a restart finds what it left open), then
// every SweepInterval.
func (d *Dispatcher) resume(ctx context.Context) {
	// The startup sweep runs in the background, after Run reports ready:
	// with thousands of turns open it takes a while, and a replica that can
	// take new turns should say so meanwhile (found by the soak: a restart
	// under load was not ready within a minute).
	d.background(func(bctx context.Context) {
		ctx, stop := d.withRunContext(bctx)
		defer stop()
		d.sweep(ctx, true)
		for ctx.Err() == nil {
			backoff.Sleep(ctx, backoff.Jitter(d.opts.SweepInterval))
			if ctx.Err() == nil {
				d.sweep(ctx, false)
			}
		}
	})
}

// resumeTurn re-arms a turn this replica does not gather for, or every
// open turn at start. known, if not nil, is what the startup sweep's
// listing found recorded: a turn whose results it does not all hold is
// not re-checked (the rest reach this replica, which gathers for it from
// now on; those recorded before, a second listing finds:
// recheckCompletedSince), so a restart asks nothing of the result streams
// per turn.
func (d *Dispatcher) resumeTurn(ctx context.Context, t *Turn, rev uint64, known *recordedResults) {
	switch t.State {
	case TurnCollecting:
		if err := d.scheduleDeadline(ctx, t); err != nil {
			d.log.Warn("re-arming deadline failed", "turn", t.Key, "err", err)
		}
		// Re-publish only calls without a result: a call already run and
		// acknowledged must not be queued again once the dedupe window
		// has passed. Calls rejected at intake are never published; their
		// failure is recorded if intake stopped before it could.
		recorded, err := d.gather.recorded(ctx, t, known)
		if err != nil {
			d.log.Warn("re-arming turn: reading its results failed", "turn", t.Key, "err", err)
			return
		}
		d.gather.track(t, rev)
		d.failRejected(ctx, t, recorded)
		d.answerSelf(ctx, t, recorded)
		d.publishCallsAgain(ctx, t, d.settleHeld(ctx, t, recorded))
		if known == nil || len(recorded) == len(t.Calls) {
			d.gather.recheckSoon(t.Key)
		}
	case TurnSubmitting:
		// The replica that owned it may have died mid-submission: the
		// engine takes it over once its lease lapses, and submits it
		// again. The platform adapters make a repeat harmless.
		d.gather.track(t, rev)
		d.engine.Close(string(t.Key))
	}
}

// releaseAll releases, at shutdown, the leases of the turns this replica
// works on, so that the others or the restart take them at once rather
// than once the leases lapse. It waits for that a moment.
func (d *Dispatcher) releaseAll() {
	d.engine.Release(func() []string { return d.gather.ownedBy(d.instance) })
	wait, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	for !d.engine.Idle() && backoff.Sleep(wait, 5*time.Millisecond) {
	}
	if !d.engine.Idle() {
		d.log.Warn("turns still being closed at shutdown; their leases lapse for the other replicas to take them")
	}
}

func (d *Dispatcher) emit(e Event) {
	if d.opts.OnEvent != nil {
		d.opts.OnEvent(e)
	}
}
