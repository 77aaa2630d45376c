// Package exec is the library teams use to serve their functions to AI
// agents through toolrelay.
//
// An [Executor] serves the functions of one team. [Executor.Register] adds a
// [Function] (name, description, JSON Schema, limits and a [Handler]);
// [Executor.Run] provisions the team's work-queue stream FNCALLS_<team> and
// one durable pull consumer per function, announces the functions in the
// registry (refusing a name another team owns) and serves calls until its
// context ends.
//
// # Delivery
//
// Calls are delivered at least once. Every replica of a function shares its
// consumer, so each delivery goes to one process; the consumer's
// MaxAckPending is the function's global concurrency cap. A handler runs
// under the call's absolute deadline and sends a heartbeat while it runs, so
// long calls are not redelivered mid-run. Its result is recorded before the
// call is acknowledged, and the first result recorded for a call wins: a
// redelivered call whose result exists is acknowledged without running.
//
// # Errors
//
// A handler's error becomes a failed result whose message the model reads;
// write it for the model. A handler that passes the deadline yields a
// "timed out" result; a panic is recovered, its stack logged, and the model
// sees only that the function failed.
//
// # Shutdown
//
// When Run's context ends the executor stops fetching, waits up to
// [Options.ShutdownTimeout] for running calls, then cancels them with
// [ErrShutdown]; calls not finished are redelivered to another replica.
package exec
