package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/approval"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Approvals. A call whose function's policy (package approval) wants a
// person's decision is held at intake: not published, but recorded in
// the approval bucket as awaiting_approval, announced on
// protocol.ApprovalRequestedSubject and given an auto-deny timer. The decision is
// a compare-and-set on that record, so of two deciders (two replicas, two
// people) exactly one wins, and it flows into the turn as the events the
// turn engine already has: approved, the call is published as intake
// would have published it (the same message ID); denied or not decided in
// time, it gets a failed result through the normal results path. Nothing
// here writes the turn's record.

// ApprovalState is where a held call is: awaiting_approval until one
// decision moves it, once, to approved, denied or expired.
type ApprovalState string

// Approval states.
const (
	ApprovalAwaiting ApprovalState = "awaiting_approval"
	ApprovalApproved ApprovalState = "approved"
	ApprovalDenied   ApprovalState = "denied"
	// ApprovalExpired: nobody decided before the call's auto-deny time.
	ApprovalExpired ApprovalState = "expired"
)

// Approval is a held call's record in the approval bucket, and what the
// approval API, the console and the announcements show.
type Approval struct {
	CallKey  protocol.CallKey  `json:"call_key"`
	Turn     protocol.TurnKey  `json:"turn"`
	CallID   string            `json:"call_id"`
	Platform protocol.Platform `json:"platform"`
	Team     string            `json:"team"`
	Function string            `json:"function"`
	// MCPServer is the server label of an MCP approval request (Function
	// is then its tool); empty for a held function call.
	MCPServer string          `json:"mcp_server,omitempty"`
	Arguments json.RawMessage `json:"arguments"`
	State     ApprovalState   `json:"state"`
	// Condition is the policy's when, if the call was held by one.
	Condition string   `json:"condition,omitempty"`
	Approvers []string `json:"approvers"`
	// RequestedAt is intake; Deadline the turn's (its run's expiry less
	// the submit margin); AutoDenyAt when the call is denied undecided:
	// the function's timeout (at least MinApprovalRunWindow) before
	// Deadline.
	RequestedAt time.Time `json:"requested_at"`
	Deadline    time.Time `json:"deadline"`
	AutoDenyAt  time.Time `json:"auto_deny_at"`
	DecidedBy   string    `json:"decided_by,omitempty"`
	DecidedAt   time.Time `json:"decided_at,omitzero"`
	Reason      string    `json:"reason,omitempty"`
	TraceID     string    `json:"trace_id,omitempty"`
	// rev is the record's revision, for the compare-and-set of a decision.
	rev uint64
}

// MinApprovalRunWindow is the least time an approved call is left to run
// before its turn's deadline, for a function that declares no timeout:
// its auto-deny time is at least this long before the deadline.
const MinApprovalRunWindow = 10 * time.Second

// Errors of a decision.
var (
	// ErrNotApprover: the caller may see the call but is not among its
	// approvers.
	ErrNotApprover = errors.New("dispatch: not among the call's approvers")
	// ErrDecided: the call was decided already (by another person or
	// replica, or automatically); the error says how.
	ErrDecided = errors.New("dispatch: the call was decided already")
)

// hold is what intake needs to hold a call: its policy and its function's
// timeout.
type hold struct {
	policy  *approval.Policy
	timeout time.Duration
}

// holdOf evaluates the policy of the function live declares for c's
// arguments: the call's hold, or nil when it runs unheld. Only a function
// with a policy pays more than a nil check.
func (d *Dispatcher) holdOf(c *TurnCall, live *declared) *hold {
	if live.policy == nil {
		return nil
	}
	need, err := live.policy.Evaluate(c.Arguments)
	if err != nil {
		d.log.Warn("an approval condition could not be evaluated for a call; it waits for a decision", "call_key", c.Key, "fn", c.Name, "err", err)
	}
	if !need {
		return nil
	}
	return &hold{policy: live.policy, timeout: time.Duration(live.decl.Spec.Timeout)}
}

// holdCalls records the approval of each held call of t and arms its
// auto-deny timer, before t's record exists: a recorded turn's held calls
// always have theirs. A record already there (the same turn taken in
// again) is kept as it is. It returns the held calls' keys, to publish
// none of them.
func (d *Dispatcher) holdCalls(ctx context.Context, t *Turn, holds map[protocol.CallKey]*hold) (map[protocol.CallKey]bool, error) {
	held := make(map[protocol.CallKey]bool, len(holds))
	traceID := traceIDOf(ctx, t)
	now := time.Now().UTC()
	for key, h := range holds {
		c := t.call(key)
		spec := h.policy.Spec()
		a := &Approval{CallKey: key, Turn: t.Key, CallID: c.ID, Platform: t.Ref.Platform, Team: c.Team, Function: c.Name,
			MCPServer: c.MCPServer, Arguments: c.Arguments, State: ApprovalAwaiting, Condition: spec.When, Approvers: h.policy.Approvers(),
			RequestedAt: now, Deadline: t.Deadline, TraceID: traceID, AutoDenyAt: t.Deadline.Add(-max(h.timeout, MinApprovalRunWindow)).UTC()}
		if !a.AutoDenyAt.After(now) {
			// No time to ask: the call could not run in time if approved.
			a.State, a.DecidedBy, a.DecidedAt = ApprovalExpired, "toolrelay", now
			a.Reason = "the run's deadline left no time to ask"
		}
		b, _ := json.Marshal(a)
		_, err := d.approvals.Create(ctx, string(key), b)
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return nil, fmt.Errorf("dispatch: hold call %s for approval: %w", key, err)
		}
		if err == nil && a.State == ApprovalExpired { // decided here, and counted once
			d.countApproval(ctx, a, "requested")
			d.countApproval(ctx, a, string(ApprovalExpired))
		}
		if a.State == ApprovalAwaiting {
			if _, err := jspub.Publish(ctx, d.js.Conn(), approvalTimerMsg(a)); err != nil {
				return nil, fmt.Errorf("dispatch: arm the auto-deny of call %s: %w", key, err)
			}
		}
		held[key] = true
	}
	return held, nil
}

// announceHolds tells of t's held calls once t is recorded: the
// announcement and the audit trail for those awaiting a decision, the
// failure for those there was no time to ask about.
func (d *Dispatcher) announceHolds(ctx context.Context, t *Turn, held map[protocol.CallKey]bool) {
	for key := range held {
		a, err := d.approval(ctx, key)
		if err != nil {
			d.log.Warn("reading a held call's approval failed; it is listed, not announced", "call_key", key, "err", err)
			continue
		}
		switch a.State {
		case ApprovalAwaiting:
			d.countApproval(ctx, a, "requested")
			d.announce(protocol.ApprovalRequestedSubject(a.Team), a)
			d.notify(a)
			d.audit(ctx, auditRequested, a.Team, a.CallKey, "", auditEntryOf(a, auditRequested))
		case ApprovalExpired, ApprovalDenied: // no time to ask, or decided before this repeat
			d.audit(ctx, auditRequested, a.Team, a.CallKey, "", auditEntryOf(a, auditRequested))
			d.audit(ctx, decisionKind[a.State], a.Team, a.CallKey, "", auditEntryOf(a, decisionKind[a.State]))
			d.settleDenied(ctx, t, a)
		}
	}
}

// settleHeld adds to recorded (the calls of t with a result, which no
// resume publishes) t's held calls that must not be published now: those
// awaiting a decision, and those denied, whose failure it records again
// (first-wins: a decider that died before recording it). A held call
// approved is left out, so it is published again like any call without a
// result. A held call with no approval record (its function's policy was
// evaluated, but the record not written: an older intake) is held again
// with no time to ask, failing as not approved.
func (d *Dispatcher) settleHeld(ctx context.Context, t *Turn, recorded map[protocol.CallKey]bool) map[protocol.CallKey]bool {
	out, copied := recorded, false
	for i := range t.Calls {
		c := &t.Calls[i]
		if !c.Approval || recorded[c.Key] {
			continue
		}
		if !copied { // recorded is the caller's
			out, copied = maps.Clone(recorded), true
			if out == nil {
				out = map[protocol.CallKey]bool{}
			}
		}
		a, err := d.approval(ctx, c.Key)
		if err != nil {
			d.log.Warn("reading a held call's approval failed; it is not published", "call_key", c.Key, "err", err)
			out[c.Key] = true
			continue
		}
		d.auditRequestedAgain(ctx, a)
		switch a.State {
		case ApprovalApproved:
			if c.MCPServer != "" { // answered, not published
				out[c.Key] = true
				d.recordMCPDecision(ctx, t, c, a)
			}
		case ApprovalAwaiting:
			out[c.Key] = true
			_, _ = jspub.Publish(ctx, d.js.Conn(), approvalTimerMsg(a)) // deduplicated: armed at intake
		default:
			out[c.Key] = true
			d.settleDenied(ctx, t, a)
		}
	}
	return out
}

// approval reads a held call's record.
func (d *Dispatcher) approval(ctx context.Context, key protocol.CallKey) (*Approval, error) {
	e, err := d.approvals.Get(ctx, string(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, notFound("held call", string(key), err)
	}
	if err != nil {
		return nil, err
	}
	var a Approval
	if err := json.Unmarshal(e.Value(), &a); err != nil {
		return nil, fmt.Errorf("dispatch: decode approval %s: %w", key, err)
	}
	a.rev = e.Revision()
	return &a, nil
}

// decide moves a from awaiting_approval to state by compare-and-set; it
// returns ErrDecided, with the decision that won, if another came first.
func (d *Dispatcher) decide(ctx context.Context, a *Approval, state ApprovalState, by, reason string) (*Approval, error) {
	if a.State != ApprovalAwaiting {
		return a, decidedError(a)
	}
	next := *a
	next.State, next.DecidedBy, next.DecidedAt, next.Reason = state, by, time.Now().UTC(), reason
	b, _ := json.Marshal(&next)
	rev, err := d.approvals.Update(ctx, string(a.CallKey), b, a.rev)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		won, rerr := d.approval(ctx, a.CallKey)
		if rerr != nil {
			return nil, rerr
		}
		return won, decidedError(won)
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: record the decision on %s: %w", a.CallKey, err)
	}
	next.rev = rev
	return &next, nil
}

func decidedError(a *Approval) error {
	if a.State == ApprovalExpired {
		return fmt.Errorf("%w: it was not approved in time and was denied automatically at %s", ErrDecided, a.DecidedAt.Format(time.RFC3339))
	}
	return fmt.Errorf("%w: %s by %s at %s", ErrDecided, a.State, a.DecidedBy, a.DecidedAt.Format(time.RFC3339))
}

// Decision is one person's decision on a held call.
type Decision struct {
	Approve bool
	// Reason is why; shown to the model when the call is denied.
	Reason string
}

// maxReason bounds a decision's reason, which the model reads.
const maxReason = 1 << 10

// Decide approves or denies the held call key for caller: approved, the
// call is published to its function's executors; denied, it fails with
// the decider's name and reason, which the model reads. It returns the
// record as decided. Errors: ErrNotFound (no such held call, or not in
// caller's scope), ErrNotApprover, ErrDecided (with the record of the
// decision that came first, which stands; an approval after the call's
// auto-deny time denies it, and is refused so), and JetStream failures.
func (d *Dispatcher) Decide(ctx context.Context, caller Caller, key protocol.CallKey, dec Decision) (*Approval, error) {
	if len(dec.Reason) > maxReason {
		return nil, &FieldError{Field: "reason", Message: fmt.Sprintf("the reason is %d bytes; at most %d", len(dec.Reason), maxReason)}
	}
	a, err := d.approval(ctx, key)
	if err != nil {
		return nil, err
	}
	decider := approval.Decider{Name: caller.Name, Admin: caller.Admin, Teams: caller.Teams, ToolsOnly: caller.ToolsOnly}
	if !caller.Sees(a.Team) && !approval.MayDecide(a.Approvers, a.Team, decider) {
		return nil, fmt.Errorf("%w: held call %q", ErrNotFound, key) // another team's: not even said to exist
	}
	if !approval.MayDecide(a.Approvers, a.Team, decider) {
		return nil, fmt.Errorf("%w: %s may be decided by %v", ErrNotApprover, key, a.Approvers)
	}
	if a.State != ApprovalAwaiting {
		return a, decidedError(a)
	}
	t, _, err := d.turns.get(ctx, a.Turn)
	// A call is held before its turn's record is written: a decision that
	// comes between the two (a quick approver, a bot on the announcement)
	// waits a moment for the intake under way to write it.
	wait := backoff.Backoff{Initial: 10 * time.Millisecond, Max: 640 * time.Millisecond}
	for tries := 0; errors.Is(err, jetstream.ErrKeyNotFound) && tries < 7; tries++ {
		if !backoff.Sleep(ctx, wait.Next()) {
			return nil, ctx.Err()
		}
		t, _, err = d.turns.get(ctx, a.Turn)
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: read the turn of %s: %w", key, err)
	}
	state := ApprovalDenied
	if dec.Approve {
		state = ApprovalApproved
		if !t.Open() || time.Now().After(a.AutoDenyAt) {
			// Too late to run: the auto-deny is due, or the turn closed.
			// It is denied now, and the approval refused as one that came
			// after that decision.
			if a, err = d.expire(ctx, t, a); err != nil {
				return a, err
			}
			return a, fmt.Errorf("%w: too late to approve: it could no longer run before its run's deadline, and was denied automatically", ErrDecided)
		}
	}
	a, err = d.decide(ctx, a, state, caller.Name, dec.Reason)
	if err != nil {
		return a, err
	}
	d.afterDecision(ctx, t, a)
	return a, nil
}

// afterDecision carries a decision into the turn, announces it and
// appends it to the audit trail.
func (d *Dispatcher) afterDecision(ctx context.Context, t *Turn, a *Approval) {
	d.log.InfoContext(ctx, "a held call was decided", "call_key", a.CallKey, "fn", a.Function, "team", a.Team, "state", a.State, "by", a.DecidedBy)
	d.countApproval(ctx, a, string(a.State))
	d.auditRequestedAgain(ctx, a)
	d.audit(ctx, decisionKind[a.State], a.Team, a.CallKey, "", auditEntryOf(a, decisionKind[a.State]))
	d.announce(protocol.ApprovalDecidedSubject(a.Team), a)
	if a.State == ApprovalApproved {
		d.runApproved(ctx, t, a)
		return
	}
	d.settleDenied(ctx, t, a)
}

// runApproved carries the approval a into t: an MCP approval request gets
// its answer, any other call is published.
func (d *Dispatcher) runApproved(ctx context.Context, t *Turn, a *Approval) {
	if c := t.call(a.CallKey); c != nil && c.MCPServer != "" {
		d.recordMCPDecision(ctx, t, c, a)
		return
	}
	d.publishApproved(ctx, t, a.CallKey)
}

// auditRequestedAgain appends a's request to the audit trail again: the
// intake that held it may have stopped between writing its record and
// telling the trail. Within the trail's duplicates window a repeat adds
// nothing; past it, nothing is appended, as the entry would be a second.
func (d *Dispatcher) auditRequestedAgain(ctx context.Context, a *Approval) {
	if time.Since(a.RequestedAt) < auditRepeatDropped {
		d.audit(ctx, auditRequested, a.Team, a.CallKey, "", auditEntryOf(a, auditRequested))
	}
}

// countApproval counts a held call's step: requested, or its decision.
func (d *Dispatcher) countApproval(ctx context.Context, a *Approval, outcome string) {
	d.tel.approvals.Add(ctx, 1, metric.WithAttributes(attrTeam.String(a.Team), attrFunction.String(a.Function), attrOutcome.String(outcome)))
}

// publishApproved publishes the approved call key of t, as intake would
// have: the same message, so a repeat is dropped by its message ID.
func (d *Dispatcher) publishApproved(ctx context.Context, t *Turn, key protocol.CallKey) {
	ctx, stop := d.detached(ctx) // once decided, the call goes out even if the request ends
	defer stop()
	skip := make(map[protocol.CallKey]bool, len(t.Calls))
	for i := range t.Calls {
		if t.Calls[i].Key != key {
			skip[t.Calls[i].Key] = true
		}
	}
	d.publishCalls(ctx, t, skip, nil)
}

// settleDenied records the failure of a call denied or not approved in
// time, first-wins like any result: the model reads who denied it and
// why, or that nobody approved it in time.
func (d *Dispatcher) settleDenied(ctx context.Context, t *Turn, a *Approval) {
	c := t.call(a.CallKey)
	if c == nil {
		return
	}
	if c.MCPServer != "" {
		d.recordMCPDecision(ctx, t, c, a)
		return
	}
	var msg string
	switch {
	case a.State == ApprovalExpired:
		msg = fmt.Sprintf("%s was not run: it needs a person's approval, and nobody approved it in time. Tell the user it awaits approval, or continue without it.", a.Function)
	case a.Reason != "":
		msg = fmt.Sprintf("%s was not run: %s denied it: %s. Do not call it again with the same arguments; tell the user, or continue without it.", a.Function, a.DecidedBy, a.Reason)
	default:
		msg = fmt.Sprintf("%s was not run: %s denied it. Do not call it again with the same arguments; tell the user, or continue without it.", a.Function, a.DecidedBy)
	}
	ctx, stop := d.detached(ctx)
	defer stop()
	d.recordFailure(ctx, t, c, &protocol.CallError{Code: protocol.CodeDenied, Message: msg})
}

// expire denies a held call nobody decided in time.
func (d *Dispatcher) expire(ctx context.Context, t *Turn, a *Approval) (*Approval, error) {
	a, err := d.decide(ctx, a, ApprovalExpired, "toolrelay", "not approved in time")
	if err != nil {
		return a, err
	}
	d.afterDecision(ctx, t, a)
	return a, nil
}

// announce publishes a on subject, for chat bots and the like: best
// effort (the approval API lists what an announcement missed).
func (d *Dispatcher) announce(subject string, a *Approval) {
	b, _ := json.Marshal(a)
	if err := d.js.Conn().Publish(subject, b); err != nil {
		d.log.Warn("announcing an approval failed", "call_key", a.CallKey, "err", err)
	}
}

// Auto-deny timers are scheduled messages in the timer stream, as turn
// deadlines are, on their own subjects: scheduled on
// fntimer.asched.<call key>, firing on fntimer.afire.<call key> into a
// consumer the replicas share. Any replica denies the call, a restart
// keeps the timer, and a timer that finds the call decided does nothing.
const approvalTimersConsumer = "toolrelay_approval_timers"

func approvalTimerMsg(a *Approval) *nats.Msg {
	return scheduledMsg(provision.TimerSubjectPrefix+".asched."+string(a.CallKey), provision.TimerSubjectPrefix+".afire."+string(a.CallKey),
		"approval."+string(a.CallKey), string(a.CallKey), a.AutoDenyAt)
}

func (d *Dispatcher) startApprovalTimers(ctx context.Context) (stop func(), err error) {
	return d.consume(ctx, d.timers, jetstream.ConsumerConfig{
		Durable:       approvalTimersConsumer,
		Description:   "toolrelay dispatchers denying calls not approved in time",
		FilterSubject: provision.TimerSubjectPrefix + ".afire.>",
		MaxAckPending: 1000,
	}, 64, func(msg jetstream.Msg) {
		key, err := protocol.ParseCallKey(string(msg.Data()))
		if err != nil {
			d.log.Error("ignoring a malformed auto-deny timer", "subject", msg.Subject(), "err", err)
			_ = msg.Term()
			return
		}
		ctx, cancel := context.WithTimeout(ctx, ackTimeout)
		defer cancel()
		if err := d.autoDeny(ctx, key); err != nil {
			d.log.Warn("denying a call not approved in time failed; retried", "call_key", key, "err", err)
			_ = msg.NakWithDelay(time.Second)
			return
		}
		_ = msg.Ack()
	})
}

// autoDeny denies key if it still awaits a decision. One approved whose
// call has no result is published again (deduplicated by its message ID):
// the replica that approved it may have died before publishing it. Only
// while the calls stream's duplicates window drops the repeat, as for any
// call published again (publishCallsAgain): later, the call may still be
// running, and a repeat would run it twice.
func (d *Dispatcher) autoDeny(ctx context.Context, key protocol.CallKey) error {
	a, err := d.approval(ctx, key)
	if errors.Is(err, ErrNotFound) {
		return nil // expired with its bucket's age limit
	}
	if err != nil {
		return err
	}
	if a.State != ApprovalAwaiting && a.State != ApprovalApproved {
		return nil
	}
	t, _, err := d.turns.get(ctx, a.Turn)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		_, err = d.decide(ctx, a, ApprovalExpired, "toolrelay", "not approved in time")
		if errors.Is(err, ErrDecided) {
			return nil
		}
		return err
	}
	if err != nil {
		return err
	}
	if a.State == ApprovalApproved {
		if !repeatDropped(a.DecidedAt) {
			return nil
		}
		if c := t.call(key); c != nil && t.Open() {
			if res, err := d.gather.result(ctx, t, c); err == nil && res == nil {
				d.runApproved(ctx, t, a)
			}
		}
		return nil
	}
	if _, err := d.expire(ctx, t, a); err != nil && !errors.Is(err, ErrDecided) {
		return err
	}
	return nil
}

// ApprovalQuery selects held calls.
type ApprovalQuery struct {
	// Team, if set, keeps one team's calls.
	Team string
	// All includes decided calls; by default only those awaiting a
	// decision, soonest auto-deny first.
	All bool
}

// Approvals lists the held calls caller may see (those of its teams, and
// those naming it as an approver): by default those awaiting a decision
// whose auto-deny time has not passed, soonest first. It reads the
// bucket, so any replica answers the same.
func (d *Dispatcher) Approvals(ctx context.Context, caller Caller, q ApprovalQuery) ([]*Approval, error) {
	w, err := d.approvals.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	decider := approval.Decider{Name: caller.Name, Admin: caller.Admin, Teams: caller.Teams, ToolsOnly: caller.ToolsOnly}
	now := time.Now()
	out := []*Approval{}
	for {
		var e jetstream.KeyValueEntry
		select {
		case e = <-w.Updates():
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e == nil {
			break // the current values are all in
		}
		if strings.HasPrefix(e.Key(), grantPrefix) {
			continue
		}
		var a Approval
		if json.Unmarshal(e.Value(), &a) != nil {
			continue
		}
		a.rev = e.Revision()
		switch {
		case q.Team != "" && a.Team != q.Team:
		case !caller.Sees(a.Team) && !approval.MayDecide(a.Approvers, a.Team, decider):
		case !q.All && (a.State != ApprovalAwaiting || now.After(a.AutoDenyAt.Add(time.Minute))):
		default:
			out = append(out, &a)
		}
	}
	slices.SortFunc(out, func(a, b *Approval) int { return a.AutoDenyAt.Compare(b.AutoDenyAt) })
	return out, nil
}

// ApprovalOf returns the held call key as caller may see it: ErrNotFound
// if there is none, or it is another team's.
func (d *Dispatcher) ApprovalOf(ctx context.Context, caller Caller, key protocol.CallKey) (*Approval, error) {
	a, err := d.approval(ctx, key)
	if err != nil {
		return nil, err
	}
	decider := approval.Decider{Name: caller.Name, Admin: caller.Admin, Teams: caller.Teams, ToolsOnly: caller.ToolsOnly}
	if !caller.Sees(a.Team) && !approval.MayDecide(a.Approvers, a.Team, decider) {
		return nil, fmt.Errorf("%w: held call %q", ErrNotFound, key)
	}
	return a, nil
}
