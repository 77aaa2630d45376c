package protocol

import "time"

// The streams, consumers and KV buckets executors use, as plain values:
// package protocol imports no NATS client, so the settings are spelled the
// way JetStream's JSON API spells them ("workqueue", "new", "explicit"),
// which is also what a client in another language sends. toolrelay's own
// provisioning (internal/provision) translates these and nothing else, so
// what is written here is what the server gets.
//
// Settings marked "semantic" below are what the contract rests on: an
// existing stream or bucket that differs in one is refused, never
// changed. The others (ages, windows) may be tuned by operators within
// the bounds given.

// Retention is a stream's retention policy, as JetStream's API names it.
type Retention string

// Retention policies toolrelay uses.
const (
	// RetentionLimits keeps messages until a limit (age, count) removes them.
	RetentionLimits Retention = "limits"
	// RetentionWorkQueue removes a message once it is acknowledged, and
	// lets only one consumer read any subject.
	RetentionWorkQueue Retention = "workqueue"
)

// Discard is what a full stream does with a new message, as JetStream's API
// names it.
type Discard string

// Discard policies toolrelay uses.
const (
	// DiscardOld drops the oldest message to make room.
	DiscardOld Discard = "old"
	// DiscardNew refuses the new message.
	DiscardNew Discard = "new"
)

// StreamSpec is what toolrelay needs of a stream.
type StreamSpec struct {
	Name        string
	Description string
	// Subjects the stream stores (semantic).
	Subjects []string
	// Retention (semantic).
	Retention Retention
	// Discard (semantic): what happens when a limit is reached.
	Discard Discard
	// MaxMsgsPerSubject caps the messages kept per subject; 0 means no
	// cap (semantic).
	MaxMsgsPerSubject int64
	// DiscardNewPerSubject applies Discard: new to the per-subject cap,
	// so that a second message on a full subject is refused (semantic).
	DiscardNewPerSubject bool
	// MaxAge is how long a message is kept at most (tunable).
	MaxAge time.Duration
	// Duplicates is the window in which a repeated Nats-Msg-Id is
	// dropped (tunable, never shorter).
	Duplicates time.Duration
	// MaxBytes bounds the stream's size; 0 means no bound but the
	// account's (tunable).
	MaxBytes int64
	// MaxMsgSize bounds one message; 0 means the server's max_payload.
	MaxMsgSize int32
	// AllowMsgTTL lets publishers set Nats-TTL per message (semantic).
	AllowMsgTTL bool
	// AllowDirect enables direct gets, which executors use to look a
	// result up by subject (semantic).
	AllowDirect bool
	// AllowMsgSchedules and AllowRollup enable scheduled messages and
	// roll-ups (semantic; only the dispatcher's timer stream uses them).
	AllowMsgSchedules bool
	AllowRollup       bool
}

// BucketSpec is what toolrelay needs of a KV bucket. Its stream is
// "KV_" + Name and its keys' subjects "$KV.<Name>.<key>".
type BucketSpec struct {
	Name        string
	Description string
	// History is how many values are kept per key (semantic).
	History int
	// TTL is the age limit of a value; 0 means none. For the declaration
	// bucket it is the lease (semantic); elsewhere tunable, never shorter.
	TTL time.Duration
	// LimitMarkerTTL, when set, makes the server leave a delete marker,
	// seen by watchers, when TTL removes a value (semantic).
	LimitMarkerTTL time.Duration
	// AllowMsgTTL lets a write carry a Nats-TTL of its own, shorter than
	// TTL, without the markers LimitMarkerTTL adds (semantic).
	AllowMsgTTL bool
}

// AckPolicy is a consumer's acknowledgement policy, as JetStream's API
// names it.
type AckPolicy string

// AckExplicit: every message is acknowledged on its own.
const AckExplicit AckPolicy = "explicit"

// DeliverPolicy is where a consumer starts, as JetStream's API names it.
type DeliverPolicy string

// DeliverAll: from the first message stored.
const DeliverAll DeliverPolicy = "all"

// ConsumerSpec is what toolrelay needs of a durable pull consumer.
type ConsumerSpec struct {
	Durable       string
	Description   string
	Stream        string
	FilterSubject string
	AckPolicy     AckPolicy
	DeliverPolicy DeliverPolicy
	// AckWait is how long the server waits for an ack, a nak or a
	// progress report before redelivering.
	AckWait time.Duration
	// MaxDeliver bounds deliveries; -1 means no bound.
	MaxDeliver int
	// MaxAckPending is how many messages may be delivered and not yet
	// acknowledged, across every client of the consumer.
	MaxAckPending int
}

// Limits of the streams and buckets. A turn lives at most the run TTL (10
// minutes by default) and never more than an hour.
const (
	// DuplicateWindow drops a dead letter written twice.
	DuplicateWindow = 15 * time.Minute
	// CallDuplicateWindow drops a call published again while its first
	// publication is within it: a dispatcher re-publishes a turn's calls
	// without a result (after a crash mid-fan-out, a restart, a repeated
	// intake) only while the turn is younger than this window, less a
	// margin, so every repeat is dropped if the call went out; past it, a
	// call still queued or running would run twice, and none is sent
	// again. The server keeps each ID for the window, about 140 bytes of
	// its heap apiece: 2 minutes hold some 170 MB at 10,000 calls/s,
	// where 15 held 1.25 GB. Streams created with a longer window (15
	// minutes before) are used as they are.
	CallDuplicateWindow = 2 * time.Minute
	// ResultDuplicateWindow is shorter: the first-wins rule refuses a
	// repeated result whenever it comes, and the window only lets a retry
	// soon after read as a duplicate. The server keeps each message ID it
	// has seen for the window, about 120 bytes of its heap apiece: with
	// 15 minutes, a fleet at 10,000 calls/s would hold about 1 GiB of
	// result IDs for nothing.
	ResultDuplicateWindow = 2 * time.Minute
	// CallMaxAge bounds how long a call can sit in a work queue; calls also
	// carry a Nats-TTL that removes them a minute after their deadline.
	CallMaxAge = time.Hour
	// ResultMaxAge bounds how long a result is kept: the backstop of a
	// result recorded with no Nats-TTL (an executor older than
	// Call.KeepResultUntil, or a call that names none), and the most
	// Call.ResultTTL asks for. It outlasts every reader: a turn lives at
	// most an hour, and the result of a call an MCP client started as a
	// task is read for an hour after the call was taken in.
	ResultMaxAge = 2 * time.Hour
	// ResultMinTTL is the shortest Nats-TTL of a result: one recorded
	// after its KeepResultUntil still answers the recorded-result check
	// of a redelivery of its call, whose own TTL ends a minute after its
	// deadline.
	ResultMinTTL = time.Minute
	// DeadLetterMaxAge is how long dead letters are kept for operators.
	DeadLetterMaxAge = 14 * 24 * time.Hour
	// CancelMemory is how long a cancellation is kept, and how far back an
	// executor starting up reads them: longer than any turn lives.
	CancelMemory = 30 * time.Minute
	// CancelDuplicateWindow drops a cancellation sent twice.
	CancelDuplicateWindow = time.Minute
	// AttemptTTL is how long an attempt mark is kept: longer than a turn.
	AttemptTTL = 2 * time.Hour
	// DefaultResultStreamBytes is the size limit of each team's result
	// stream unless the dispatcher is given another: about 410,000
	// results of 650 bytes, each kept as Call.KeepResultUntil says
	// (twenty minutes after a default turn is taken in), so a team
	// sustains about 340 calls/s of such turns (docs/operations.md).
	DefaultResultStreamBytes = 256 << 20
	// DefaultAckWait is the function consumers' AckWait unless an
	// executor chooses another; running calls report progress every
	// AckWait/3.
	DefaultAckWait = 30 * time.Second
)

// CallStreamSpec is team's work queue of calls. Work-queue retention
// removes a call once acked and lets only one consumer read each function's
// subject, so a call is handed to one executor at a time; Discard: new makes
// a full queue refuse new calls (the dispatcher fails them at once) rather
// than drop queued ones; AllowMsgTTL lets each call expire a minute after its
// deadline.
func CallStreamSpec(team string) StreamSpec {
	return StreamSpec{
		Name:        CallStream(team),
		Description: "toolrelay calls of team " + team,
		Subjects:    CallStreamSubjects(team),
		Retention:   RetentionWorkQueue,
		Discard:     DiscardNew,
		MaxAge:      CallMaxAge,
		Duplicates:  CallDuplicateWindow,
		MaxMsgSize:  MaxEnvelopeSize,
		AllowMsgTTL: true,
		AllowDirect: true,
	}
}

// ResultStreamSpec holds team's results. MaxMsgsPerSubject 1 with
// DiscardNewPerSubject makes the server refuse a second result on a call's
// subject: the first result recorded wins, whoever writes it (an executor,
// or the dispatcher failing a call). Writers also publish with
// Nats-Expected-Last-Subject-Sequence: 0, and a repeat of the same
// publication soon after is dropped by its Nats-Msg-Id, within Duplicates.
// AllowMsgTTL lets each result carry Call.ResultTTL as its Nats-TTL, so
// that it goes once nothing reads it; MaxAge bounds one without. MaxBytes
// bounds what one team can store (the dispatcher's setting; see
// DefaultResultStreamBytes): a team that floods its results stream, or
// pins its results with a Nats-TTL of "never", only fills its own.
func ResultStreamSpec(team string, maxBytes int64) StreamSpec {
	return StreamSpec{
		Name:                 ResultStream(team),
		Description:          "toolrelay results of team " + team + ", first result per call wins",
		Subjects:             ResultStreamSubjects(team),
		Retention:            RetentionLimits,
		Discard:              DiscardNew,
		MaxMsgsPerSubject:    1,
		DiscardNewPerSubject: true,
		MaxAge:               ResultMaxAge,
		MaxBytes:             maxBytes,
		Duplicates:           ResultDuplicateWindow,
		MaxMsgSize:           MaxEnvelopeSize,
		AllowMsgTTL:          true,
		AllowDirect:          true,
	}
}

// DeadLetterStreamSpec keeps dead letters, one per call (by message ID) and
// one per replay of it.
func DeadLetterStreamSpec() StreamSpec {
	return StreamSpec{
		Name:        DeadLetterStream,
		Description: "toolrelay dead letters: calls that failed for good, and replays",
		Subjects:    []string{DeadLetterSubjectPrefix + ".>"},
		Retention:   RetentionLimits,
		Discard:     DiscardOld,
		MaxAge:      DeadLetterMaxAge,
		Duplicates:  DuplicateWindow,
		AllowDirect: true,
	}
}

// CancelStreamSpec keeps turn cancellations for CancelMemory, so an
// executor starting late still learns of every turn cancelled while it
// could have calls of it.
func CancelStreamSpec() StreamSpec {
	return StreamSpec{
		Name:        CancelStream,
		Description: "toolrelay turn cancellations",
		Subjects:    []string{CancelSubjectPrefix + ".>"},
		Retention:   RetentionLimits,
		Discard:     DiscardOld,
		MaxAge:      CancelMemory,
		Duplicates:  CancelDuplicateWindow,
	}
}

// RegistryBucketSpec holds each function's claim: the FunctionSpec of its
// owning team, under the function's name. Only dispatchers write claims, by
// compare-and-set (create, or update at the revision read): the first team
// to declare a name owns it, and two teams racing for a name cannot both
// win. Executors never touch this bucket.
func RegistryBucketSpec() BucketSpec {
	return BucketSpec{Name: RegistryBucket, Description: "toolrelay function registry", History: 5}
}

// DeclarationBucketSpec holds executors' live declarations, each a lease:
// its TTL is LeaseTTL, so a declaration its process stopped renewing is
// removed by the server, which leaves a marker (LimitMarkerTTL) so that
// dispatchers watching the bucket see it go. Only dispatchers write it, on
// an executor's DeclareRequest.
func DeclarationBucketSpec() BucketSpec {
	return BucketSpec{
		Name:           DeclarationBucket,
		Description:    "toolrelay executors serving functions now, each a lease its process renews",
		History:        1,
		TTL:            LeaseTTL,
		LimitMarkerTTL: LeaseTTL,
	}
}

// AttemptBucketSpec holds the attempt marks of side-effect functions, under
// AttemptKey.
func AttemptBucketSpec() BucketSpec {
	return BucketSpec{Name: AttemptBucket, Description: "toolrelay attempts of side-effect functions", History: 1, TTL: AttemptTTL}
}

// FunctionConsumerSpec is the one durable consumer all executors of a
// function share, on its team's call stream. Because they share it,
// maxAckPending is a global cap on the function's calls in flight, however
// many processes serve it. MaxDeliver is unbounded: executors bound
// attempts themselves and every call has a TTL, so each call ends in a
// result rather than silently stopping.
func FunctionConsumerSpec(team, function string, maxAckPending int, ackWait time.Duration) ConsumerSpec {
	return ConsumerSpec{
		Durable:       function,
		Description:   "toolrelay executor pool of " + function,
		Stream:        CallStream(team),
		FilterSubject: CallSubject(team, function),
		AckPolicy:     AckExplicit,
		DeliverPolicy: DeliverAll,
		AckWait:       ackWait,
		MaxDeliver:    -1,
		MaxAckPending: maxAckPending,
	}
}

// ExecutorStreams and ExecutorBuckets list what an executor of team uses,
// for operators provisioning ahead of executors (deploy/nats) and for
// executors in other languages.
func ExecutorStreams(team string) []StreamSpec {
	return []StreamSpec{CallStreamSpec(team), DeadLetterStreamSpec(), CancelStreamSpec()}
}

// ExecutorBuckets lists the KV buckets an executor uses in its own account.
func ExecutorBuckets() []BucketSpec {
	return []BucketSpec{AttemptBucketSpec()}
}

// ControlStreams and ControlBuckets list what the dispatchers own, for team
// (results) and for everyone (the registry and the declarations): in a
// deployment with an account per team they live in the control account,
// which teams reach only through the subjects DESIGN.md's tenancy names.
func ControlStreams(team string, resultBytes int64) []StreamSpec {
	return []StreamSpec{ResultStreamSpec(team, resultBytes)}
}

// ControlBuckets lists the KV buckets only dispatchers write.
func ControlBuckets() []BucketSpec {
	return []BucketSpec{RegistryBucketSpec(), DeclarationBucketSpec(), NameBucketSpec()}
}
