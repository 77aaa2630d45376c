// Package protocol is the wire contract of toolrelay on NATS JetStream:
// everything an executor or an operator needs to interoperate with the
// dispatcher. It owns the subjects calls, results, dead letters and
// cancellations travel on, the header names, the envelopes (Call, Result,
// DeadLetter, FunctionSpec, Declaration, AttemptMark), the keys that
// identify turns and calls and the message IDs derived from them, name
// validation, the error codes a failed call carries, and the settings of
// the streams, the function consumers and the KV buckets executors use
// ([StreamSpec], [ConsumerSpec], [BucketSpec]), each with what it
// guarantees. docs/protocol.md explains the contract to people writing
// executors in other languages; its examples and tables are checked against
// this package by its tests.
//
// It is a leaf package: it may import only the standard library and
// github.com/google/uuid (a test holds it to that), and no NATS client, so
// the settings are plain
// values spelled as JetStream's API spells them; internal/provision
// translates them into nats.go configurations. Anything may import it: the
// dispatcher (package dispatch), the executor library (package exec),
// provisioning, tools, and executors written on it and a NATS client alone.
// Resources only the dispatcher uses (turn records, watches, deadline
// timers) are not part of it. The dispatcher and pkg/exec never import
// each other: what they agree on is defined here, and internal/provision
// and internal/firstwins and internal/lease, which both use, only apply it.
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
// the first result recorded for a call wins: the stream keeps one message per
// subject and refuses a second ([ResultStreamSpec]). Team and function names
// are validated so that no name can inject ".", "*", ">" or whitespace into a
// subject.
//
// # Registry
//
// A team claims a function in the [RegistryBucket] by compare-and-set; each
// executor process declares what it serves now in the [DeclarationBucket]
// under [DeclarationKey], a lease it renews every [LeaseRenewal] and that
// the server removes [LeaseTTL] after the last renewal.
//
// A function's description and the strings of its schema are tool text:
// one team's words that every agent given the tool reads. [ValidateToolText]
// bounds their size ([MaxDescriptionSize] and the constants beside it) and
// refuses invisible and control characters in them; executors and the
// dispatchers both apply it.
//
// # Errors
//
// A failed call carries an [ErrorCode] from a fixed list and a message written
// for the model. [Result.ModelOutput] renders a result the way platforms
// without a failure flag expect it.
package protocol
