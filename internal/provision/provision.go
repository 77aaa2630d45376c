// Package provision creates the streams, consumers and KV buckets toolrelay
// uses, idempotently. An existing resource whose configuration would change
// toolrelay's semantics is reported, never silently replaced. It translates
// the specs of package protocol and nothing else; it imports protocol and
// nats.go's jetstream only.
package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/leaderread"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Options shape every resource. The zero value suits a single server.
type Options struct {
	// Replicas of each stream and bucket. Default: 1. Use 3 on a cluster.
	Replicas int
}

func (o Options) replicas() int { return max(o.Replicas, 1) }

// IncompatibleError reports an existing resource whose configuration
// differs from what toolrelay needs in a way that changes its behaviour.
type IncompatibleError struct {
	Kind, Name string
	Diffs      []string
}

func (e *IncompatibleError) Error() string {
	return fmt.Sprintf("provision: %s %s exists with an incompatible configuration (%s); toolrelay will not change it: remove it, or point toolrelay at another account",
		e.Kind, e.Name, strings.Join(e.Diffs, "; "))
}

// Resources only the dispatcher uses. No executor reads or writes them, so
// they are not part of the wire contract (package protocol).
const (
	// TimerStream holds the deadline timers of open turns, scheduled on
	// TimerSubjectPrefix.sched.<turn> and firing on .fire.<turn>.
	TimerStream        = "FNTIMERS"
	TimerSubjectPrefix = "fntimer"
	// TurnBucket maps turn keys to the dispatcher's turn records.
	TurnBucket = "toolrelay_turns"
	// WatchBucket maps watch IDs to what the dispatcher drives for them.
	WatchBucket = "toolrelay_watches"
	// WebhookBucket remembers the webhook-ids already taken in, so a
	// replayed delivery does nothing new on any replica.
	WebhookBucket = "toolrelay_webhooks"
	// ResponseBucket maps the responses the dispatcher drives to their
	// watch, so a response.completed webhook finds its watch.
	ResponseBucket = "toolrelay_responses"
	// StepBucket remembers, per Agents session turn, the calls of its
	// latest step, so that the step's remaining calls, seen again while
	// their results are being submitted one by one, are not a new turn.
	StepBucket = "toolrelay_steps"
	// TaskBucket indexes the calls MCP clients started as tasks by their
	// client: <client tag>.<turn key>, so a client's tasks are listed
	// without reading every turn.
	TaskBucket = "toolrelay_tasks"
	// ApprovalBucket holds, by call key, the calls held for a person's
	// decision and what was decided, changed only by compare-and-set.
	ApprovalBucket = "toolrelay_approvals"
	// AuditStream is the audit trail: approval requests, decisions and
	// runs of side-effecting functions, on AuditSubjectPrefix.<team>.<kind>.
	AuditStream        = "TOOLRELAY_AUDIT"
	AuditSubjectPrefix = "toolrelay.audit"

	// turnTTL outlives any turn (at most an hour).
	turnTTL = 2 * time.Hour
)

// StreamConfig translates a stream of the wire contract into the
// configuration toolrelay creates, adding what the contract leaves to
// the deployment (storage, replicas).
func StreamConfig(spec protocol.StreamSpec, o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 spec.Name,
		Description:          spec.Description,
		Subjects:             slices.Clone(spec.Subjects),
		Retention:            retention(spec.Retention),
		Discard:              discard(spec.Discard),
		MaxMsgsPerSubject:    spec.MaxMsgsPerSubject,
		DiscardNewPerSubject: spec.DiscardNewPerSubject,
		MaxAge:               spec.MaxAge,
		Duplicates:           spec.Duplicates,
		MaxBytes:             maxBytesOrNone(spec.MaxBytes),
		MaxMsgSize:           spec.MaxMsgSize,
		AllowMsgTTL:          spec.AllowMsgTTL,
		AllowDirect:          spec.AllowDirect,
		AllowMsgSchedules:    spec.AllowMsgSchedules,
		AllowRollup:          spec.AllowRollup,
		Storage:              jetstream.FileStorage,
		Replicas:             o.replicas(),
	}
}

// maxBytesOrNone is JetStream's spelling of a size limit: -1 for none.
func maxBytesOrNone(n int64) int64 {
	if n <= 0 {
		return -1
	}
	return n
}

// BucketConfig is a bucket's configuration: what jetstream's
// KeyValueConfig says, and whether its stream allows per-message TTLs,
// which KeyValueConfig cannot say without delete markers (KeyValue sets it
// on the bucket's stream).
type BucketConfig struct {
	jetstream.KeyValueConfig
	AllowMsgTTL bool
}

// KeyValueConfig translates a bucket of the wire contract.
func KeyValueConfig(spec protocol.BucketSpec, o Options) BucketConfig {
	return BucketConfig{KeyValueConfig: jetstream.KeyValueConfig{
		Bucket:         spec.Name,
		Description:    spec.Description,
		History:        uint8(spec.History),
		TTL:            spec.TTL,
		LimitMarkerTTL: spec.LimitMarkerTTL,
		Storage:        jetstream.FileStorage,
		Replicas:       o.replicas(),
	}, AllowMsgTTL: spec.AllowMsgTTL}
}

// ConsumerConfig translates a consumer of the wire contract.
func ConsumerConfig(spec protocol.ConsumerSpec) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       spec.Durable,
		Description:   spec.Description,
		FilterSubject: spec.FilterSubject,
		AckPolicy:     ackPolicy(spec.AckPolicy),
		DeliverPolicy: deliverPolicy(spec.DeliverPolicy),
		AckWait:       spec.AckWait,
		MaxDeliver:    spec.MaxDeliver,
		MaxAckPending: spec.MaxAckPending,
	}
}

// The translations below panic on a value protocol does not define: specs
// are constants of the program, so that is a programming error, caught by
// the tests that translate every spec.

func retention(r protocol.Retention) jetstream.RetentionPolicy {
	switch r {
	case protocol.RetentionLimits:
		return jetstream.LimitsPolicy
	case protocol.RetentionWorkQueue:
		return jetstream.WorkQueuePolicy
	}
	panic(fmt.Sprintf("provision: unknown retention %q", r))
}

func discard(d protocol.Discard) jetstream.DiscardPolicy {
	switch d {
	case protocol.DiscardOld:
		return jetstream.DiscardOld
	case protocol.DiscardNew:
		return jetstream.DiscardNew
	}
	panic(fmt.Sprintf("provision: unknown discard policy %q", d))
}

func ackPolicy(a protocol.AckPolicy) jetstream.AckPolicy {
	if a == protocol.AckExplicit {
		return jetstream.AckExplicitPolicy
	}
	panic(fmt.Sprintf("provision: unknown ack policy %q", a))
}

func deliverPolicy(d protocol.DeliverPolicy) jetstream.DeliverPolicy {
	if d == protocol.DeliverAll {
		return jetstream.DeliverAllPolicy
	}
	panic(fmt.Sprintf("provision: unknown deliver policy %q", d))
}

// CallStreamConfig is a team's work-queue stream of calls.
func CallStreamConfig(team string, o Options) jetstream.StreamConfig {
	c := StreamConfig(protocol.CallStreamSpec(team), o)
	c.Metadata = map[string]string{"toolrelay.team": team}
	return c
}

// ResultStreamConfig holds team's results, at most maxBytes of them
// (0: protocol.DefaultResultStreamBytes); one per call, the first wins.
func ResultStreamConfig(team string, maxBytes int64, o Options) jetstream.StreamConfig {
	if maxBytes <= 0 {
		maxBytes = protocol.DefaultResultStreamBytes
	}
	return StreamConfig(protocol.ResultStreamSpec(team, maxBytes), o)
}

// DeadLetterStreamConfig keeps dead letters for two weeks, one per call.
func DeadLetterStreamConfig(o Options) jetstream.StreamConfig {
	return StreamConfig(protocol.DeadLetterStreamSpec(), o)
}

// CancelStreamConfig keeps turn cancellations long enough for an executor
// starting late to learn of them.
func CancelStreamConfig(o Options) jetstream.StreamConfig {
	return StreamConfig(protocol.CancelStreamSpec(), o)
}

// RegistryBucketConfig holds the functions executors announce.
func RegistryBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.RegistryBucketSpec(), o)
}

// DeclarationBucketConfig holds the declarations of live executor
// processes, each a lease (see protocol.DeclarationBucketSpec).
func DeclarationBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.DeclarationBucketSpec(), o)
}

// NameBucketConfig holds the owners of function names by canonical form
// (see protocol.NameBucketSpec).
func NameBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.NameBucketSpec(), o)
}

// AttemptBucketConfig records started attempts of side-effect functions.
func AttemptBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.AttemptBucketSpec(), o)
}

// FunctionConsumerConfig is the durable consumer every executor of a
// function shares (see protocol.FunctionConsumerSpec).
func FunctionConsumerConfig(team, function string, maxAckPending int, ackWait time.Duration) jetstream.ConsumerConfig {
	c := ConsumerConfig(protocol.FunctionConsumerSpec(team, function, maxAckPending, ackWait))
	c.Metadata = map[string]string{"toolrelay.team": team, "toolrelay.function": function}
	return c
}

// TimerStreamConfig holds the deadline timers of turns as scheduled messages.
func TimerStreamConfig(o Options) jetstream.StreamConfig {
	return StreamConfig(protocol.StreamSpec{
		Name:              TimerStream,
		Description:       "toolrelay turn deadline timers",
		Subjects:          []string{TimerSubjectPrefix + ".>"},
		Retention:         protocol.RetentionLimits,
		Discard:           protocol.DiscardOld,
		MaxAge:            turnTTL,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
		// A closed turn's timer is removed by a roll-up marker (a normal,
		// asynchronous publish) rather than a purge request.
		AllowRollup: true,
	}, o)
}

// TurnBucketConfig holds turn records, changed only by compare-and-set.
// An open turn's record is kept turnTTL after its last write; the write
// that closes a turn carries a Nats-TTL of minutes (pkg/dispatch), which
// the bucket allows.
func TurnBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: TurnBucket, Description: "toolrelay turn state", History: 1, TTL: turnTTL, AllowMsgTTL: true}, o)
}

// ApprovalBucketConfig holds the calls awaiting approval and their
// decisions: kept as long as any turn.
func ApprovalBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: ApprovalBucket, Description: "toolrelay calls held for approval", History: 1, TTL: turnTTL}, o)
}

// AuditStreamConfig holds the audit trail for retention (at least a
// minute) in at most maxBytes (then the oldest entries go), one subject
// per team and kind of entry.
func AuditStreamConfig(retention time.Duration, maxBytes int64, o Options) jetstream.StreamConfig {
	return StreamConfig(protocol.StreamSpec{
		Name:        AuditStream,
		Description: "toolrelay audit trail: approval requests, decisions, runs of side-effecting functions",
		Subjects:    []string{AuditSubjectPrefix + ".>"},
		Retention:   protocol.RetentionLimits,
		Discard:     protocol.DiscardOld,
		MaxAge:      max(retention, time.Minute),
		MaxBytes:    maxBytes,
		// Entries carry message IDs: a replica that records an entry again
		// after a failover adds nothing.
		Duplicates: 10 * time.Minute,
	}, o)
}

// WatchBucketConfig holds what the dispatcher watches on request.
func WatchBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: WatchBucket, Description: "toolrelay watches", History: 1, TTL: turnTTL}, o)
}

// WebhookBucketConfig remembers webhook-ids longer than the 5-minute
// timestamp tolerance, after which a replay is refused anyway.
func WebhookBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: WebhookBucket, Description: "toolrelay webhook-ids taken in", History: 1, TTL: 15 * time.Minute}, o)
}

// ResponseBucketConfig maps driven responses to their watches.
func ResponseBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: ResponseBucket, Description: "toolrelay responses driven by a watch", History: 1, TTL: turnTTL}, o)
}

// StepBucketConfig holds the calls of each Agents session turn's latest
// step.
func StepBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: StepBucket, Description: "toolrelay steps of Agents session turns", History: 1, TTL: turnTTL}, o)
}

// TaskBucketConfig indexes started calls by their client; an entry lives
// as long as the turn it names.
func TaskBucketConfig(o Options) BucketConfig {
	return KeyValueConfig(protocol.BucketSpec{Name: TaskBucket, Description: "toolrelay MCP tasks by client", History: 1, TTL: turnTTL}, o)
}

// Stream checks that the stream exists and is compatible, or creates it.
// It looks up before creating, so a user allowed only to read a stream that
// the control plane created (see deploy/nats) never needs create rights.
func Stream(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if err == nil {
			return s, nil
		}
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return nil, fmt.Errorf("provision: create stream %s: %w", want.Name, err)
		}
		s, err = js.Stream(ctx, want.Name) // created meanwhile by another process
	}
	if err != nil {
		return nil, fmt.Errorf("provision: look up stream %s: %w", want.Name, err)
	}
	if diffs := streamDiffs(want, s.CachedInfo().Config); len(diffs) > 0 {
		return nil, &IncompatibleError{Kind: "stream", Name: want.Name, Diffs: diffs}
	}
	if want.AllowMsgTTL {
		return allowMsgTTL(ctx, js, s)
	}
	return s, nil
}

// allowMsgTTL lets s take per-message TTLs if it does not yet: a stream
// created before toolrelay set them (results, turn records) is updated in
// place. The server allows turning them on, never off, and nothing stored
// changes: messages without a Nats-TTL keep the stream's MaxAge.
func allowMsgTTL(ctx context.Context, js jetstream.JetStream, s jetstream.Stream) (jetstream.Stream, error) {
	cfg := s.CachedInfo().Config
	if cfg.AllowMsgTTL {
		return s, nil
	}
	cfg.AllowMsgTTL = true
	u, err := js.UpdateStream(ctx, cfg)
	if err != nil {
		return s, &MsgTTLError{Stream: cfg.Name, Err: err}
	}
	return u, nil
}

// MsgTTLError says a stream could not be updated to take per-message
// TTLs. Stream returns it with the stream as it is: a writer whose writes
// fall back to none there (results: firstwins records a result without
// its TTL, kept for the stream's MaxAge) may use it, and say so.
type MsgTTLError struct {
	Stream string
	Err    error
}

func (e *MsgTTLError) Error() string {
	return fmt.Sprintf("provision: allow per-message TTLs on stream %s (nats-server 2.11 or later, and the right to update it): %v", e.Stream, e.Err)
}

func (e *MsgTTLError) Unwrap() error { return e.Err }

// streamDiffs lists the differences that change toolrelay's semantics.
// Sizes and ages may differ: operators tune them. Per-message TTLs are
// not among them: Stream turns them on where they are missing.
func streamDiffs(want, have jetstream.StreamConfig) []string {
	var d []string
	add := func(field string, w, h any) {
		d = append(d, fmt.Sprintf("%s is %v, toolrelay needs %v", field, h, w))
	}
	if !slices.Equal(sorted(want.Subjects), sorted(have.Subjects)) {
		add("subjects", have.Subjects, want.Subjects)
	}
	if want.Retention != have.Retention {
		add("retention", want.Retention, have.Retention)
	}
	if max(want.MaxMsgsPerSubject, 0) != max(have.MaxMsgsPerSubject, 0) { // 0 and -1 both mean no limit
		add("max_msgs_per_subject", want.MaxMsgsPerSubject, have.MaxMsgsPerSubject)
	}
	if want.Discard != have.Discard {
		add("discard", want.Discard, have.Discard)
	}
	if want.DiscardNewPerSubject != have.DiscardNewPerSubject {
		add("discard_new_per_subject", want.DiscardNewPerSubject, have.DiscardNewPerSubject)
	}
	if want.AllowMsgSchedules && !have.AllowMsgSchedules {
		add("allow_msg_schedules", want.AllowMsgSchedules, have.AllowMsgSchedules)
	}
	if want.AllowRollup && !have.AllowRollup {
		add("allow_rollup_hdrs", want.AllowRollup, have.AllowRollup)
	}
	if want.AllowDirect && !have.AllowDirect {
		add("allow_direct", want.AllowDirect, have.AllowDirect)
	}
	if have.Duplicates < want.Duplicates {
		add("duplicate_window", want.Duplicates, have.Duplicates)
	}
	return d
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// KeyValue checks that the bucket exists and is compatible, or creates it,
// looking up first like Stream. Its Get is answered by the bucket's
// leader (leaderread): every bucket allows direct gets, which a replica
// that lags answers with what it has, and toolrelay decides on what it
// reads.
//
// A bucket that should allow per-message TTLs (want.AllowMsgTTL) has
// them turned on on its stream, whether created here or before.
func KeyValue(ctx context.Context, js jetstream.JetStream, want BucketConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, want.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, want.KeyValueConfig)
		if err == nil {
			return bucketTTLs(ctx, js, want, kv)
		}
		if !errors.Is(err, jetstream.ErrBucketExists) {
			return nil, fmt.Errorf("provision: create bucket %s: %w", want.Bucket, err)
		}
		kv, err = js.KeyValue(ctx, want.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("provision: look up bucket %s: %w", want.Bucket, err)
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("provision: bucket %s status: %w", want.Bucket, err)
	}
	var diffs []string
	if int64(want.History) != st.History() {
		diffs = append(diffs, fmt.Sprintf("history is %d, toolrelay needs %d", st.History(), want.History))
	}
	if want.TTL != 0 && st.TTL() != 0 && st.TTL() < want.TTL {
		diffs = append(diffs, fmt.Sprintf("ttl is %s, toolrelay needs at least %s", st.TTL(), want.TTL))
	}
	if want.LimitMarkerTTL != 0 && st.LimitMarkerTTL() == 0 {
		diffs = append(diffs, fmt.Sprintf("limit_marker_ttl is unset, toolrelay needs %s (nats-server 2.11 or later)", want.LimitMarkerTTL))
	}
	if len(diffs) > 0 {
		return nil, &IncompatibleError{Kind: "bucket", Name: want.Bucket, Diffs: diffs}
	}
	return bucketTTLs(ctx, js, want, kv)
}

// bucketTTLs turns per-message TTLs on on kv's stream if want asks for
// them, and returns kv read from its leader.
func bucketTTLs(ctx context.Context, js jetstream.JetStream, want BucketConfig, kv jetstream.KeyValue) (jetstream.KeyValue, error) {
	if want.AllowMsgTTL {
		s, err := js.Stream(ctx, "KV_"+want.Bucket)
		if err != nil {
			return nil, fmt.Errorf("provision: look up the stream of bucket %s: %w", want.Bucket, err)
		}
		if _, err := allowMsgTTL(ctx, js, s); err != nil {
			return nil, err
		}
	}
	return leaderread.KV(js, kv), nil
}

// Consumer creates a durable consumer, or checks the existing one. Fields
// JetStream can change in place (limits, ack wait) are updated to match;
// a different filter or ack policy is an IncompatibleError.
func Consumer(ctx context.Context, s jetstream.Stream, want jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := s.Consumer(ctx, want.Durable)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		c, err = s.CreateConsumer(ctx, want)
		if err == nil {
			return c, nil
		}
		if !errors.Is(err, jetstream.ErrConsumerExists) {
			return nil, fmt.Errorf("provision: create consumer %s on %s: %w", want.Durable, s.CachedInfo().Config.Name, err)
		}
		// Another process created it meanwhile: check it like any other.
		c, err = s.Consumer(ctx, want.Durable)
	}
	if err != nil {
		return nil, fmt.Errorf("provision: look up consumer %s: %w", want.Durable, err)
	}
	have := c.CachedInfo().Config
	var diffs []string
	if have.FilterSubject != want.FilterSubject {
		diffs = append(diffs, fmt.Sprintf("filter subject is %q, toolrelay needs %q", have.FilterSubject, want.FilterSubject))
	}
	if have.AckPolicy != want.AckPolicy {
		diffs = append(diffs, fmt.Sprintf("ack policy is %v, toolrelay needs %v", have.AckPolicy, want.AckPolicy))
	}
	if len(diffs) > 0 {
		return nil, &IncompatibleError{Kind: "consumer", Name: want.Durable, Diffs: diffs}
	}
	if have.MaxAckPending != want.MaxAckPending || have.AckWait != want.AckWait || have.MaxDeliver != want.MaxDeliver {
		upd := have
		upd.MaxAckPending, upd.AckWait, upd.MaxDeliver = want.MaxAckPending, want.AckWait, want.MaxDeliver
		if c, err = s.UpdateConsumer(ctx, upd); err != nil {
			return nil, fmt.Errorf("provision: update consumer %s limits: %w", want.Durable, err)
		}
	}
	return c, nil
}
