// Package exec is the library teams use to serve their functions to AI
// agents through toolrelay.
//
// It owns the executor's side of the wire contract: registering functions
// (name, schema, owner, limits), consuming their calls, running handlers
// under the call's deadline with heartbeats, retries and panic recovery,
// recording results and dead letters, side-effect bookkeeping, draining at
// shutdown, and connecting to NATS for a long-running process ([Connect]).
// It imports pkg/protocol (the wire contract), nats.go, OpenTelemetry, the
// JSON Schema libraries and the internal packages that provision streams,
// record first results and keep leases; never pkg/dispatch, which in turn
// never imports it: the two meet only in pkg/protocol.
//
// An [Executor] serves the functions of one team. [Executor.Register] adds a
// [Function] (name, description, JSON Schema, limits and a [Handler]);
// [Executor.Run] provisions the team's work-queue stream FNCALLS_<team> and
// one durable pull consumer per function, claims the functions for the
// team in the registry (refusing a name another team owns), declares them
// as served by this process — a lease renewed every
// [protocol.LeaseRenewal] and withdrawn when Run returns, so dispatchers
// validate and route by what live processes serve — and serves calls until
// its context ends. Handlers follow the net/http pattern: [Handler],
// [HandlerFunc] and [Middleware] (the first given runs outermost).
// [TypedHandler] decodes the arguments into a Go type and encodes what the
// function returns as JSON; the function's JSON Schema is then derived
// from that type ([SchemaFor]). [CommandHandler] and [HTTPHandler] run a
// program or call an endpoint. A [HandlerFunc] takes and returns raw bytes.
//
// # Delivery
//
// Calls are delivered at least once. Every replica of a function shares its
// consumer, so each delivery goes to one process; the consumer's
// MaxAckPending is the function's global concurrency cap
// ([Function.MaxConcurrency]) and each process pulls no more calls than it
// has free workers ([Function.Concurrency]). A handler runs under the
// call's absolute deadline (and the function's timeout) and heartbeats
// while it runs, so long calls are not redelivered mid-run. Its result is
// recorded before the call is acknowledged, and the first result recorded
// for a call wins: a redelivered call whose result exists is acknowledged
// without running. A handler reads the call from its [Invocation]: the
// envelope (name, arguments, keys, platform, deadline) and the attempt;
// code that has only the context gets it with [InvocationFromContext].
//
// # Errors and retries
//
// A handler's error becomes a failed result whose message the model reads;
// write it for the model. An error wrapped with [Retryable] is retried with
// exponential backoff and jitter ([RetryPolicy]) while attempts remain and
// the deadline leaves room. A permanent error, a recovered panic (its stack
// logged, never shown to the model) or exhausted attempts end in exactly one
// failed result and a dead-letter record, kept per call. [NewDeadLetters]
// returns the inspector: [DeadLetters.List] lists a team's
// ([DeadLetters.ListNewest] the newest few), [DeadLetters.Get] finds one
// call's by its key and [DeadLetters.Replay] runs it again. It reads by
// direct get only, so the control plane can read a team's dead letters
// across accounts ([NewTeamDeadLetters]) without any right to write them.
//
// An expected refusal is not a failure an operator must look at: a
// handler that declines a request as designed (the order has already
// shipped, no customer has that email) returns an error wrapped with
// [Refuse], or wrapping [ErrRefused] with %w. The model gets exactly one
// failed result (function_error) with the error's message; it is not
// retried, even if it also wraps [ErrRetryable], and leaves no dead letter.
// A [CommandHandler] refuses by exiting with status 65 (EX_DATAERR), an
// endpoint behind [HTTPHandler] by answering 409 or 422.
//
// # Side effects
//
// A [Function] with SideEffects never runs twice for one call: an attempt
// that may have run without recording a result (its executor died or was
// shut down mid-run) goes to the function's Reconcile hook, or fails saying
// the call may have run.
//
// # Healing
//
// A function's consumer can vanish under a running executor: deleted by an
// operator, its stream recreated or restored, a server started again on a
// fresh store. The executor notices (the server's "consumer deleted", or
// missing pull heartbeats confirmed by a look-up) and recreates what it
// provisions — the team's streams, buckets and the consumer — within
// seconds, then serves again. Where it cannot (the process lacks the rights
// to create them, or what exists now is incompatible), it logs an error
// saying why, withdraws its declaration of that function so no dispatcher
// counts it served, keeps looking every few seconds, and declares the
// function again once its consumer exists. A process declares a function
// only while the function's consumer exists and pulls.
//
// # Shutdown
//
// When Run's context ends the executor stops fetching, waits up to
// [Options.ShutdownTimeout] for running calls, then cancels them with
// [ErrShutdown]; calls not finished are redelivered to another replica.
//
// # Testing
//
// Package exectest is the test double: it delivers one call to a function
// exactly as an executor would, without NATS, and says what the executor
// would do next (record, retry, refuse, dead-letter). It can set the
// attempt number and run a side-effect function's Reconcile path.
package exec
