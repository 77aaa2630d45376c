package dispatch

import (
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// How long a turn leaves its record and its calls' results behind. A
// closed turn's record and the results are kept until keepUntil: past the
// run's expiry, after which no platform takes a submission, by
// keepAfterExpiry, so that a repeated intake of the turn (a webhook
// redelivered, a poll that raced the submission) still finds it closed
// and GET /v1/turns/{key} still shows it; a started call (an MCP task) as
// long as its client may read it. Open turns' records are kept as long as
// the bucket's TTL, longer than any turn lives.
const (
	// keepAfterExpiry is how long after its run expires a closed turn is
	// kept: twice the 5 minutes a webhook's timestamp may be off.
	keepAfterExpiry = 10 * time.Minute
	// StartedCallTTL is how long after it was taken in a started call
	// ([Dispatcher.StartCall]) can be read: its record and result are
	// kept that long at least.
	StartedCallTTL = time.Hour
	// stepKeep is how long the step bucket keeps an Agents session's
	// latest step, which names its turn (provision.StepBucketConfig's
	// age limit): an Agents turn is kept as long, so that a request
	// repeating the step finds its turn, closed, rather than nothing.
	stepKeep = 2 * time.Hour
)

// keepUntil is when t's closed record and its results may go.
func (t *Turn) keepUntil() time.Time {
	keep := t.ExpiresAt.Add(keepAfterExpiry)
	if started := t.CreatedAt.Add(StartedCallTTL); isStartedCall(t) && started.After(keep) {
		keep = started
	}
	if t.Ref.Platform == protocol.PlatformAgents {
		keep = maxTime(keep, t.CreatedAt.Add(stepKeep))
	}
	return keep
}

// resultTTL is the Nats-TTL of a result of t recorded at now, by the
// rule every executor follows (protocol.Call.ResultTTL).
func (t *Turn) resultTTL(now time.Time) time.Duration {
	c := protocol.Call{KeepResultUntil: t.keepUntil()}
	return c.ResultTTL(now)
}

// closedTTL is the Nats-TTL of the write that closes t at now: until
// keepUntil, at least closedMinTTL (a turn closed late is still read by
// the replicas awaiting it), rounded up to a second.
func (t *Turn) closedTTL(now time.Time) time.Duration {
	ttl := max(t.keepUntil().Sub(now), closedMinTTL)
	return (ttl + time.Second - 1).Truncate(time.Second)
}

// closedMinTTL is the least a closed turn's record is kept.
const closedMinTTL = time.Minute

// isStartedCall reports whether t is the turn of a started call: its scope
// is startedScope's, "mcp/<client tag>/<id>" (a direct call's is
// "mcp/<id>").
func isStartedCall(t *Turn) bool {
	return t.Ref.Platform == protocol.PlatformMCP && strings.Count(t.Scope, "/") == 2
}
