package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The audit trail is a stream of the dispatcher's (provision.AuditStream)
// kept for Options.AuditRetention: every approval request, every decision
// (who, when, why) and every run of a side-effecting function (its
// outcome, attempt and trace). Entries are on
// toolrelay.audit.<team>.<kind>, so a caller reads its teams' alone.

// Defaults of the audit trail: how long it keeps an entry, and the bytes
// it may take (then the oldest entries go first).
const (
	DefaultAuditRetention = 90 * 24 * time.Hour
	DefaultAuditBytes     = 1 << 30
)

// auditKind is the kind of an audit entry, the last token of its subject.
type auditKind string

const (
	auditRequested auditKind = "requested"
	auditApproved  auditKind = "approved"
	auditDenied    auditKind = "denied"
	auditExpired   auditKind = "expired"
	auditRun       auditKind = "run"
)

// auditRepeatDropped is how long after an entry the audit stream drops a
// repeat of it (its duplicates window, provision.AuditStreamConfig), less
// a margin for the clocks.
const auditRepeatDropped = 10*time.Minute - republishMargin

// decisionKind is the audit entry of each decided state.
var decisionKind = map[ApprovalState]auditKind{ApprovalApproved: auditApproved, ApprovalDenied: auditDenied, ApprovalExpired: auditExpired}

// AuditEntry is one entry of the audit trail.
type AuditEntry struct {
	// Kind is requested, approved, denied, expired (denied automatically,
	// not approved in time) or run (a side-effecting function ran).
	Kind     string            `json:"kind"`
	At       time.Time         `json:"at"`
	Team     string            `json:"team"`
	Function string            `json:"function"`
	CallKey  protocol.CallKey  `json:"call_key"`
	Turn     protocol.TurnKey  `json:"turn"`
	Platform protocol.Platform `json:"platform,omitempty"`
	// MCPServer is the server label of an MCP approval request (Function
	// is its tool).
	MCPServer string `json:"mcp_server,omitempty"`
	// Arguments are the call's, on a request.
	Arguments json.RawMessage `json:"arguments,omitempty"`
	// Approvers and Condition are the policy's, on a request.
	Approvers []string `json:"approvers,omitempty"`
	Condition string   `json:"condition,omitempty"`
	// By and Reason are the decider's, on a decision.
	By     string `json:"by,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Attempt, Outcome (ok, or the failure's code), Error and Executor
	// are the run's.
	Attempt  int    `json:"attempt,omitempty"`
	Outcome  string `json:"outcome,omitempty"`
	Error    string `json:"error,omitempty"`
	Executor string `json:"executor,omitempty"`
	TraceID  string `json:"trace_id,omitempty"`
	// Seq is the entry's position in the trail (read back only).
	Seq uint64 `json:"seq,omitempty"`
}

func auditEntryOf(a *Approval, kind auditKind) *AuditEntry {
	e := &AuditEntry{Kind: string(kind), At: time.Now().UTC(), Team: a.Team, Function: a.Function, CallKey: a.CallKey,
		Turn: a.Turn, Platform: a.Platform, MCPServer: a.MCPServer, TraceID: a.TraceID}
	if kind == auditRequested {
		e.At, e.Arguments, e.Approvers, e.Condition = a.RequestedAt, a.Arguments, a.Approvers, a.Condition
	} else {
		e.At, e.By, e.Reason = a.DecidedAt, a.DecidedBy, a.Reason
	}
	return e
}

// audit appends e to the trail, deduplicated by kind, call and attempt:
// a replica that records it again adds nothing. A failure is logged; the
// approval record and the results stay the source of truth.
func (d *Dispatcher) audit(ctx context.Context, kind auditKind, team string, key protocol.CallKey, attempt string, e *AuditEntry) {
	b, _ := json.Marshal(e)
	m := &nats.Msg{Subject: provision.AuditSubjectPrefix + "." + team + "." + string(kind), Data: b, Header: nats.Header{}}
	m.Header.Set(jetstream.MsgIDHeader, string(kind)+"."+string(key)+attempt)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if _, err := d.js.PublishMsg(ctx, m); err != nil {
		d.log.ErrorContext(ctx, "appending to the audit trail failed", "kind", kind, "call_key", key, "err", err)
	}
}

// auditRun appends the run of side-effecting call c of t that res
// reports. A failure the dispatcher recorded itself (a call denied, or
// refused at intake) did not run.
func (d *Dispatcher) auditRun(ctx context.Context, t *Turn, c *TurnCall, res *protocol.Result) {
	if res.Attempt == 0 && res.Error != nil && len(res.Executor) > len("dispatcher/") && res.Executor[:len("dispatcher/")] == "dispatcher/" {
		return
	}
	e := &AuditEntry{Kind: string(auditRun), At: res.FinishedAt, Team: c.Team, Function: c.Name, CallKey: c.Key,
		Turn: c.Key.Turn(), Attempt: res.Attempt, Outcome: "ok", Executor: res.Executor}
	if t != nil {
		e.Platform = t.Ref.Platform
	}
	if res.Error != nil {
		e.Outcome, e.Error = string(res.Error.Code), res.Error.Message
	}
	e.TraceID = traceIDOf(ctx, t)
	d.audit(ctx, auditRun, c.Team, c.Key, "."+strconv.Itoa(res.Attempt), e)
}

// provisionAudit creates or checks the audit stream, and gives an
// existing one the retention asked for: an operator changes it by the
// setting, not by hand.
func provisionAudit(ctx context.Context, js jetstream.JetStream, retention time.Duration, maxBytes int64, o provision.Options) (jetstream.Stream, error) {
	want := provision.AuditStreamConfig(retention, maxBytes, o)
	s, err := provision.Stream(ctx, js, want)
	if err != nil {
		return nil, err
	}
	if have := s.CachedInfo().Config; have.MaxAge != want.MaxAge || have.MaxBytes != want.MaxBytes {
		have.MaxAge, have.MaxBytes = want.MaxAge, want.MaxBytes
		if s, err = js.UpdateStream(ctx, have); err != nil {
			return nil, fmt.Errorf("dispatch: set the audit trail's retention to %s and %d bytes: %w", want.MaxAge, want.MaxBytes, err)
		}
	}
	return s, nil
}

// traceIDOf is the trace of ctx's span or, without one, of t's (a turn
// recorded by a replica that traced it).
func traceIDOf(ctx context.Context, t *Turn) string {
	if sc := trace.SpanContextFromContext(ctx); sc.TraceID().IsValid() {
		return sc.TraceID().String()
	}
	if t != nil {
		// traceparent: 00-<trace ID, 32 hex>-<span ID>-<flags>
		if p := t.Trace.Traceparent; len(p) >= 35 && p[2] == '-' && p[35] == '-' {
			return p[3:35]
		}
	}
	return ""
}

// AuditQuery selects entries of the audit trail.
type AuditQuery struct {
	// Team, if set, keeps one team's entries; it must be in the caller's
	// scope.
	Team string
	// Since keeps entries appended at or after it. Default: all kept.
	Since time.Time
	// Limit bounds the entries returned, the oldest first. Default and
	// at most: MaxAuditEntries.
	Limit int
}

// MaxAuditEntries bounds one read of the audit trail.
const MaxAuditEntries = 10_000

// Audit reads the audit trail as caller may: its teams' entries (an
// admin's, all), oldest first. ErrOutOfScope for a team the caller does
// not see.
func (d *Dispatcher) Audit(ctx context.Context, caller Caller, q AuditQuery) ([]AuditEntry, error) {
	limit := q.Limit
	if limit <= 0 || limit > MaxAuditEntries {
		limit = MaxAuditEntries
	}
	var filters []string
	switch {
	case q.Team != "":
		if !caller.Sees(q.Team) {
			return nil, fmt.Errorf("%w: team %s", ErrOutOfScope, q.Team)
		}
		filters = []string{provision.AuditSubjectPrefix + "." + q.Team + ".>"}
	case caller.Admin:
		filters = []string{provision.AuditSubjectPrefix + ".>"}
	default:
		for _, team := range slices.Sorted(slices.Values(caller.Teams)) {
			filters = append(filters, provision.AuditSubjectPrefix+"."+team+".>")
		}
	}
	out := []AuditEntry{}
	if len(filters) == 0 {
		return out, nil
	}
	cfg := jetstream.OrderedConsumerConfig{FilterSubjects: filters}
	if !q.Since.IsZero() {
		cfg.DeliverPolicy, cfg.OptStartTime = jetstream.DeliverByStartTimePolicy, &q.Since
	}
	cons, err := d.audits.OrderedConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("dispatch: read the audit trail: %w", err)
	}
	if cons.CachedInfo().NumPending == 0 {
		return out, nil
	}
	for len(out) < limit {
		batch, err := cons.Fetch(min(limit-len(out), 256), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			return nil, fmt.Errorf("dispatch: read the audit trail: %w", err)
		}
		last := true
		n := 0
		for m := range batch.Messages() {
			n++
			var e AuditEntry
			if json.Unmarshal(m.Data(), &e) != nil {
				continue
			}
			meta, err := m.Metadata()
			if err == nil {
				e.Seq = meta.Sequence.Stream
				last = meta.NumPending == 0
			}
			out = append(out, e)
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("dispatch: read the audit trail: %w", err)
		}
		if last || n == 0 {
			break
		}
	}
	return out, nil
}
