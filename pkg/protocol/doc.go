// Package protocol is the wire contract of toolrelay on NATS: the subjects calls
// and results travel on, the header names, the Call and Result envelopes, the
// keys that identify turns and calls, name validation and the error codes a
// failed call carries.
//
// It is a leaf package: the dispatcher (package dispatch) and the executors
// (package exec) meet only here, and it imports nothing but the standard
// library.
//
// # Identity
//
// A turn is one required action of a platform: the calls the model asked for
// in one go. Its [TurnKey] is derived from the platform, the scope (session,
// thread and run, or response) and the call IDs, so every replica and every
// channel (webhook, stream, poll) that sees the same required action derives
// the same key. A call's [CallKey] is "<turn>.<call>"; it is the JetStream
// message ID of both the call and its result, so re-publishing either is
// deduplicated by the server.
//
// # Subjects
//
// Calls are published to fncall.<team>.<function> in the work-queue stream
// FNCALLS_<team>; results to fnresult.<team>.<turn>.<call> in FNRESULTS, where
// the first result recorded for a call wins. Team and function names are
// validated so that no name can inject ".", "*", ">" or whitespace into a
// subject.
//
// # Errors
//
// A failed call carries an [ErrorCode] from a fixed list and a message written
// for the model. [Result.ModelOutput] renders a result the way platforms
// without a failure flag expect it.
package protocol
