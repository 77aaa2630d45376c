package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/internal/lease"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// DefaultShutdownTimeout is Options.ShutdownTimeout's default.
const DefaultShutdownTimeout = 10 * time.Second

// DefaultRetry is the retry policy of functions that set none.
var DefaultRetry = RetryPolicy{MaxAttempts: 3, InitialBackoff: 200 * time.Millisecond, MaxBackoff: 10 * time.Second}

// Options configures an Executor. The zero value is valid.
type Options struct {
	// Logger receives the executor's logs. Default: slog.Default().
	Logger *slog.Logger
	// Name identifies this process in results and logs.
	// Default: "<hostname>-<random>".
	Name string
	// Middleware wraps every function's handler; the first runs outermost.
	Middleware []Middleware
	// AckWait is how long JetStream waits before redelivering a call whose
	// executor went silent; running calls send a heartbeat every AckWait/3.
	// Default: 30s.
	AckWait time.Duration
	// ShutdownTimeout is how long Run waits for running calls after its
	// context ends before cancelling them. Default: 10s.
	ShutdownTimeout time.Duration
	// Replicas of the streams and buckets the executor creates. Default: 1.
	Replicas int
	// ControlAPIPrefix is where this team's account reaches the control
	// plane's JetStream API (to look its own results up) in a deployment
	// with an account per team: protocol.ControlAPIPrefix there (the
	// executor command's TOOLRELAY_CONTROL_API_PREFIX). Empty: the control
	// plane shares this account, and the executor creates its team's result
	// stream itself if no dispatcher has yet.
	ControlAPIPrefix string
	// Retry is how retryable errors are retried; a Function may override
	// it. Default: 3 attempts, backoff from 200ms doubling to 10s.
	Retry RetryPolicy
	// TracerProvider and MeterProvider receive the executor's spans and
	// metrics. Default: the OpenTelemetry globals.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// NoTelemetry leaves out the Tracing and Metrics middleware that
	// otherwise wrap every handler (outermost, before Middleware). The
	// process and send spans around each message remain.
	NoTelemetry bool
}

// Executor serves the functions of one team from JetStream. Many executor
// processes may serve the same functions: they share one durable consumer
// per function, so each call runs on one of them.
type Executor struct {
	js    jetstream.JetStream
	team  string
	opts  Options
	log   *slog.Logger
	mu    sync.Mutex
	funcs map[string]*Function
	ran   bool
	// served says which functions this process declares (set by Run).
	served *served
	// serving is closed once Run serves (see Serving).
	serving chan struct{}
}

// New returns an executor for team's functions on js.
func New(js jetstream.JetStream, team string, opts Options) (*Executor, error) {
	if err := protocol.ValidateTeamName(team); err != nil {
		return nil, fmt.Errorf("exec: %w", err)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Name == "" {
		host, _ := os.Hostname()
		opts.Name = host + "-" + uuid.NewString()[:8]
	}
	if opts.AckWait <= 0 {
		opts.AckWait = protocol.DefaultAckWait
	}
	if opts.ShutdownTimeout <= 0 {
		opts.ShutdownTimeout = DefaultShutdownTimeout
	}
	return &Executor{
		js: js, team: team, opts: opts,
		log:     opts.Logger.With("team", team, "executor", opts.Name),
		funcs:   map[string]*Function{},
		serving: make(chan struct{}),
	}, nil
}

// Serving returns a channel closed once Run has set everything up and
// declared the functions: from then on calls of them reach this process.
// It is never closed if Run fails before (a name another team owns, say)
// or is stopped while starting.
func (e *Executor) Serving() <-chan struct{} { return e.serving }

// Register adds a function. It must be called before Run.
func (e *Executor) Register(fn Function) error {
	if err := fn.validate(); err != nil {
		return err
	}
	if err := fn.validateMetadata(e.team); err != nil {
		return err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ran {
		return fmt.Errorf("exec: register %s: executor already running", fn.Name)
	}
	if _, dup := e.funcs[fn.Name]; dup {
		return fmt.Errorf("exec: function %s registered twice", fn.Name)
	}
	e.funcs[fn.Name] = &fn
	return nil
}

// Run provisions the team's stream and one consumer per function, claims
// the functions for the team in the registry, declares them as served by
// this process (a lease it renews while it runs), and serves calls until
// ctx ends. Then it withdraws its declarations, stops fetching, waits up to
// ShutdownTimeout for running calls, cancels the rest with ErrShutdown and
// returns nil; unfinished calls are redelivered. A function's consumer
// that disappears (deleted, its stream recreated, a server started on a
// fresh store) is recreated within seconds; where it cannot be, the
// function's declaration is withdrawn, with an error in the log, until it
// can. If the connection closes, Run stops the same way and returns that
// error.
func (e *Executor) Run(ctx context.Context) error {
	// Run is over 80 lines because it is the executor's whole lifecycle in
	// the order shutdown depends on: set up, serve, declare, wait,
	// withdraw, drain, cancel. Splitting it would scatter that order.
	e.mu.Lock()
	if e.ran {
		e.mu.Unlock()
		return errors.New("exec: Run called twice")
	}
	e.ran = true
	e.served = newServed(e.log)
	funcs := make([]*Function, 0, len(e.funcs))
	for _, f := range e.funcs {
		funcs = append(funcs, f)
	}
	e.mu.Unlock()
	if len(funcs) == 0 {
		return errors.New("exec: no functions registered")
	}

	// Set up, waiting while JetStream cannot answer yet (a cluster
	// electing leaders), as Connect waits for the servers themselves.
	var workers []*worker
	var stopCancels func()
	err := jsretry.UntilReady(ctx, e.log, "setting up", func(ctx context.Context) (err error) {
		workers, stopCancels, err = e.setUp(ctx, funcs)
		return err
	})
	if ctx.Err() != nil {
		if stopCancels != nil {
			stopCancels()
		}
		return nil // stopped while starting
	}
	if err != nil {
		return err
	}
	defer stopCancels()

	// Workers pull under sctx, which ends with ctx or when a worker fails;
	// handlers outlive it by up to ShutdownTimeout, then get ErrShutdown.
	sctx, stopServing := context.WithCancel(ctx)
	defer stopServing()
	hctx, hcancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer hcancel(ErrShutdown)
	var wg sync.WaitGroup
	errc := make(chan error, len(workers))
	for _, w := range workers {
		wg.Go(func() { _ = w.serve(sctx, hctx, func(err error) { errc <- err }) })
	}

	// Declare what this process serves, and keep the leases while it runs.
	instance := uuid.NewString()
	started := time.Now().UTC()
	decls := make([]*protocol.Declaration, 0, len(funcs))
	for _, f := range funcs {
		decls = append(decls, &protocol.Declaration{Version: protocol.Version, Spec: *f.spec(e.team, started),
			Instance: instance, Executor: e.opts.Name, StartedAt: started})
	}
	keeper, err := lease.Declare(ctx, e.js.Conn(), e.team, decls, e.log)
	if refused := (*lease.RefusedError)(nil); errors.As(err, &refused) && refused.Owned() {
		err = fmt.Errorf("%w: %w", ErrOwnedByOtherTeam, err)
	}
	if err != nil {
		// Stopped while starting (ctx ended) is a clean stop; anything else
		// is a failure to start. Either way nothing stays declared.
		stopServing()
		if keeper != nil {
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), withdrawTimeout)
			_ = keeper.Withdraw(wctx)
			cancel()
		}
		wg.Wait()
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrOwnedByOtherTeam) {
			return err
		}
		return fmt.Errorf("exec: declare functions: %w", err)
	}
	e.served.attach(ctx, keeper)
	wg.Go(func() { keeper.Run(sctx) })
	e.log.InfoContext(ctx, "executor serving", "functions", len(workers), "instance", instance)
	close(e.serving)

	var failed error
	select {
	case <-ctx.Done():
	case failed = <-errc:
		e.log.Error("a worker stopped consuming; stopping the executor", "err", failed)
	}
	stopServing()
	// The shutdown timeout counts from here, withdrawal included.
	timeout := time.NewTimer(e.opts.ShutdownTimeout)
	defer timeout.Stop()
	// Withdraw first, so dispatchers stop counting this process before its
	// running calls finish.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(withdrawTimeout, e.opts.ShutdownTimeout/2))
	if err := keeper.Withdraw(wctx); err != nil {
		e.log.Warn("withdrawing declarations failed; they lapse with their leases", "err", err, "lease", protocol.LeaseTTL.String())
	}
	cancel()
	stopped := make(chan struct{})
	go func() { wg.Wait(); close(stopped) }()
	select {
	case <-stopped:
	case <-timeout.C:
		e.log.Warn("shutdown timeout: cancelling running calls; they will be redelivered", "timeout", e.opts.ShutdownTimeout.String())
		hcancel(ErrShutdown)
		<-stopped
	}
	close(errc)
	errs := []error{failed}
	for err := range errc {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// setUp provisions what the team keeps in its own account (see
// provisionTeam) and one consumer per function, follows the team's
// cancellations (stop with stopCancels) and returns a worker per function.
func (e *Executor) setUp(ctx context.Context, funcs []*Function) ([]*worker, func(), error) {
	team, err := e.provisionTeam(ctx, funcs)
	if err != nil {
		return nil, nil, err
	}
	tel := newTelemetry(e.opts.TracerProvider, e.opts.MeterProvider)
	cancelled := newCancels()
	stopCancels, err := cancelled.follow(ctx, team.cancels, e.team)
	if err != nil {
		return nil, nil, err
	}
	workers := make([]*worker, 0, len(funcs))
	for _, f := range funcs {
		cons, err := provision.Consumer(ctx, team.calls, e.consumerConfig(f))
		if err != nil {
			stopCancels()
			return nil, nil, err
		}
		retry := e.opts.Retry
		if f.Retry != nil {
			retry = *f.Retry
		}
		mws := e.opts.Middleware
		if !e.opts.NoTelemetry {
			mws = append([]Middleware{Tracing(e.opts.TracerProvider), Metrics(e.opts.MeterProvider)}, mws...)
		}
		workers = append(workers, &worker{
			e: e, fn: f, cons: cons, apiPrefix: team.apiPrefix, attempts: team.marks, cancels: cancelled,
			retry:     retry.withDefaults(),
			handler:   chain(f.Handler, mws),
			healRetry: backoff.Backoff{Initial: time.Second, Max: 30 * time.Second},
			tel:       tel,
			log:       e.log.With("fn", f.Name),
			spanNames: spanNames{
				process: "process " + protocol.CallSubject(e.team, f.Name),
				send:    "send " + protocol.ResultSubjectPrefix + "." + e.team,
			},
		})
	}
	return workers, stopCancels, nil
}

// teamResources are what an executor provisions for its team.
type teamResources struct {
	calls, cancels jetstream.Stream
	marks          attempts
	// apiPrefix reaches the control plane's JetStream API.
	apiPrefix string
}

// provisionTeam looks up, or creates, what the team keeps in its own
// account: its call stream, the cancellations, dead letters, attempt
// marks (when a function has side effects) and, when the control plane
// shares the account, the team's results stream. Run calls it at start,
// and a worker whose consumer is gone calls it again (healConsumer):
// whoever removed the consumer may have removed these too.
func (e *Executor) provisionTeam(ctx context.Context, funcs []*Function) (*teamResources, error) {
	popts := provision.Options{Replicas: e.opts.Replicas}
	var r teamResources
	var err error
	if r.calls, err = provision.Stream(ctx, e.js, provision.CallStreamConfig(e.team, popts)); err != nil {
		return nil, err
	}
	r.apiPrefix = e.opts.ControlAPIPrefix
	if r.apiPrefix == "" {
		r.apiPrefix = protocol.DefaultAPIPrefix
		var noTTL *provision.MsgTTLError
		if _, err := provision.Stream(ctx, e.js, provision.ResultStreamConfig(e.team, 0, popts)); errors.As(err, &noTTL) {
			// Results are recorded there without their TTL (firstwins).
			e.log.Warn("the team's result stream keeps results for its MaxAge: it could not be updated to take their TTLs", "err", err)
		} else if err != nil {
			return nil, err
		}
	}
	if _, err := provision.Stream(ctx, e.js, provision.DeadLetterStreamConfig(popts)); err != nil {
		return nil, err
	}
	if r.cancels, err = provision.Stream(ctx, e.js, provision.CancelStreamConfig(popts)); err != nil {
		return nil, err
	}
	for _, f := range funcs {
		if f.SideEffects && r.marks.kv == nil {
			if r.marks.kv, err = provision.KeyValue(ctx, e.js, provision.AttemptBucketConfig(popts)); err != nil {
				return nil, err
			}
		}
	}
	return &r, nil
}

// withdrawTimeout bounds the deletion of declarations at shutdown.
const withdrawTimeout = 2 * time.Second

func (e *Executor) consumerConfig(f *Function) jetstream.ConsumerConfig {
	return provision.FunctionConsumerConfig(e.team, f.Name, f.MaxConcurrency, e.opts.AckWait)
}
