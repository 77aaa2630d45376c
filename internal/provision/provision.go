// Package provision creates the streams, consumers and KV buckets toolrelay
// uses, idempotently. An existing resource whose configuration would change
// toolrelay's semantics is reported, never silently replaced.
package provision

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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

// Durations shared by the streams: a turn lives at most RUN_TTL (10 minutes
// by default), and the dedupe window must outlive it so that re-publishing
// after a restart is deduplicated.
const (
	dedupeWindow = 15 * time.Minute
	callMaxAge   = time.Hour
	resultMaxAge = 2 * time.Hour
	turnTTL      = 2 * time.Hour
)

// CallStreamConfig is a team's work-queue stream of calls.
func CallStreamConfig(team string, o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        protocol.CallStream(team),
		Description: "toolrelay calls of team " + team,
		Subjects:    protocol.CallStreamSubjects(team),
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
		MaxAge:      callMaxAge,
		Duplicates:  dedupeWindow,
		AllowMsgTTL: true,
		// DiscardNew: a full queue refuses new calls (the dispatcher turns
		// that into a failed result) instead of dropping queued ones.
		Discard:     jetstream.DiscardNew,
		MaxMsgSize:  protocol.MaxEnvelopeSize,
		AllowDirect: true,
		Metadata:    map[string]string{"toolrelay.team": team},
	}
}

// ResultStreamConfig holds every result; one per call, the first wins.
func ResultStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 protocol.ResultStream,
		Description:          "toolrelay results, first result per call wins",
		Subjects:             []string{protocol.ResultSubjectPrefix + ".>"},
		Retention:            jetstream.LimitsPolicy,
		Storage:              jetstream.FileStorage,
		Replicas:             o.replicas(),
		MaxAge:               resultMaxAge,
		Duplicates:           dedupeWindow,
		MaxMsgsPerSubject:    1,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgSize:           protocol.MaxEnvelopeSize,
		AllowDirect:          true,
	}
}

// TimerStreamConfig holds the deadline timers of turns as scheduled messages.
func TimerStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              protocol.TimerStream,
		Description:       "toolrelay turn deadline timers",
		Subjects:          []string{protocol.TimerSubjectPrefix + ".>"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          o.replicas(),
		MaxAge:            resultMaxAge,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
		// A closed turn's timer is removed by a roll-up marker (a normal,
		// asynchronous publish) rather than a purge request.
		AllowRollup: true,
	}
}

// TurnBucketConfig holds turn records, changed only by compare-and-set.
func TurnBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      protocol.TurnBucket,
		Description: "toolrelay turn state",
		History:     1,
		TTL:         turnTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
	}
}

// RegistryBucketConfig holds the functions executors announce.
func RegistryBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      protocol.RegistryBucket,
		Description: "toolrelay function registry",
		History:     5,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
	}
}

// DeclarationBucketConfig holds the declarations of live executor
// processes. Its age limit is the lease: a declaration not renewed within
// protocol.LeaseTTL is removed by the server, which leaves a marker so
// that watchers see it go.
func DeclarationBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:         protocol.DeclarationBucket,
		Description:    "toolrelay executors serving functions now, each a lease its process renews",
		History:        1,
		TTL:            protocol.LeaseTTL,
		LimitMarkerTTL: protocol.LeaseTTL,
		Storage:        jetstream.FileStorage,
		Replicas:       o.replicas(),
	}
}

// WatchBucketConfig holds what the dispatcher watches on request.
func WatchBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      protocol.WatchBucket,
		Description: "toolrelay watches",
		History:     1,
		TTL:         turnTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
	}
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
	return s, nil
}

// streamDiffs lists the differences that change toolrelay's semantics.
// Sizes and ages may differ: operators tune them.
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
	if want.AllowMsgTTL && !have.AllowMsgTTL {
		add("allow_msg_ttl", want.AllowMsgTTL, have.AllowMsgTTL)
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
// looking up first like Stream.
func KeyValue(ctx context.Context, js jetstream.JetStream, want jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, want.Bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, want)
		if err == nil {
			return kv, nil
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
	return kv, nil
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

// DeadLetterStreamConfig keeps dead letters for two weeks, one per call.
func DeadLetterStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        protocol.DeadLetterStream,
		Description: "toolrelay dead letters: calls that failed for good, and replays",
		Subjects:    []string{protocol.DeadLetterSubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
		MaxAge:      14 * 24 * time.Hour,
		Duplicates:  dedupeWindow,
		AllowDirect: true,
	}
}

// AttemptBucketConfig records started attempts of side-effect functions.
func AttemptBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:      protocol.AttemptBucket,
		Description: "toolrelay attempts of side-effect functions",
		History:     1,
		TTL:         turnTTL,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
	}
}

// CancelStreamConfig keeps turn cancellations long enough for an executor
// starting late to learn of them (longer than any turn lives).
func CancelStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        protocol.CancelStream,
		Description: "toolrelay turn cancellations",
		Subjects:    []string{protocol.CancelSubjectPrefix + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    o.replicas(),
		MaxAge:      CancelMemory,
		Duplicates:  time.Minute,
	}
}

// CancelMemory is how long a cancellation is remembered.
const CancelMemory = 30 * time.Minute

// WebhookBucketConfig remembers webhook-ids longer than the 5-minute
// timestamp tolerance, after which a replay is refused anyway.
func WebhookBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: protocol.WebhookBucket, Description: "toolrelay webhook-ids taken in",
		History: 1, TTL: 15 * time.Minute, Storage: jetstream.FileStorage, Replicas: o.replicas(),
	}
}

// ResponseBucketConfig maps driven responses to their watches.
func ResponseBucketConfig(o Options) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: protocol.ResponseBucket, Description: "toolrelay responses driven by a watch",
		History: 1, TTL: turnTTL, Storage: jetstream.FileStorage, Replicas: o.replicas(),
	}
}
