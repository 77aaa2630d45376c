// Package kit is the protocol conformance kit: it drives an executor, in
// any language, through docs/protocol.md case by case (declare and
// ownership, success, handler error, refusal, retries and attempts,
// timeout, cancellation, a redelivery after a recorded result, side-effect
// marks and may_have_run, dead letters and replay, trace propagation, the
// schema digest, stop and hand-back) and reports one PASS or FAIL line per
// case with what it expected and what it saw.
//
// The kit plays the dispatcher's part on the wire itself: it publishes
// calls and cancellations and reads results, dead letters and attempt
// marks. Declarations need a dispatcher answering on the NATS server (the
// command starts one in-process with an embedded server). The executor
// under test serves the test functions of [Functions], whose behaviour
// the kit defines; a team implements those in its language to run the
// kit. The executor is reached through [Target]: a process the kit starts
// and stops ([Command]), or anything else that can start and stop serving.
//
// `dispatcher conformance` is the command; its test runs the kit against
// pkg/exec serving [GoFunctions].
package kit
