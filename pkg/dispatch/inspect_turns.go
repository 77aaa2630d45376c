package dispatch

import (
	"cmp"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// TurnView is a turn as GET /v1/turns and the console show it.
type TurnView struct {
	Key      protocol.TurnKey  `json:"key"`
	Platform protocol.Platform `json:"platform"`
	// Object is the platform object, for people ("assistants run
	// thread_…/run_…"); ObjectID its id (the run, session or response;
	// for an MCP call, mcp/ and the call's id).
	Object   string    `json:"object"`
	ObjectID string    `json:"object_id"`
	State    TurnState `json:"state"`
	// Outcome is "open" while the turn waits for results, then
	// "submitted", "cut_off" (submitted at its deadline without every
	// result) or "failed".
	Outcome   string   `json:"outcome"`
	Teams     []string `json:"teams"`
	Functions []string `json:"functions"`
	// OtherCalls counts calls to other teams' functions, which a caller
	// scoped to some teams does not see.
	OtherCalls int       `json:"other_calls,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	Deadline   time.Time `json:"deadline"`
	ExpiresAt  time.Time `json:"expires_at"`
	// TimeLeftMS is how long until the deadline (open turns), and BudgetMS
	// how long the turn had from intake to its deadline: the console's
	// time-left bar is their ratio.
	TimeLeftMS int64  `json:"time_left_ms"`
	TimeLeft   string `json:"time_left,omitempty"`
	BudgetMS   int64  `json:"budget_ms"`
	// SubmittedAt, Duration (intake to submission) and TimeLeftAtSubmit
	// (before the run's expiry) are set once the turn is closed.
	SubmittedAt      time.Time `json:"submitted_at,omitzero"`
	Duration         string    `json:"duration,omitempty"`
	TimeLeftAtSubmit string    `json:"time_left_at_submit,omitempty"`
	Error            string    `json:"error,omitempty"`
	// Owner is the replica submitting (or that submitted) the turn.
	Owner string `json:"owner,omitempty"`
	// TraceID is the turn's OpenTelemetry trace.
	TraceID string `json:"trace_id,omitempty"`
	// Calls are in GET /v1/turns/{key} and in the recently submitted list.
	Calls []CallReport `json:"calls,omitempty"`
	// Waiting names the calls of an open turn still without a result, as
	// function/call id (another team's as function only): the stragglers.
	// Listed for the 20 open turns nearest their deadline.
	Waiting []string `json:"waiting,omitempty"`
}

// stragglerTurns is how many of the open turns listed, nearest their
// deadline first, have their calls' results read to name the stragglers:
// a few direct gets each.
const stragglerTurns = 20

// TurnQuery filters the turns listed; empty fields match everything.
type TurnQuery struct {
	Team, Function string
	Platform       protocol.Platform
	// Outcome is open, submitted, cut_off or failed.
	Outcome string
	// OpenOnly leaves the recently closed turns out.
	OpenOnly bool
	// Limit bounds each list (open and recent). Default (0):
	// DefaultTurnLimit; negative: no limit.
	Limit int
}

// DefaultTurnLimit is how many turns each list of GET /v1/turns holds
// unless the request asks for another limit.
const DefaultTurnLimit = 500

// TurnList is the body of GET /v1/turns.
type TurnList struct {
	Now time.Time `json:"now"`
	// Open are open turns, the nearest deadline first; OpenTotal how many
	// match before the limit.
	Open      []TurnView `json:"open"`
	OpenTotal int        `json:"open_total"`
	// Recent are recently closed turns, newest first: of the latest
	// RecentKept closed turns of the fleet, whichever replica closed them
	// (the index follows the turns bucket).
	Recent     []TurnView `json:"recent,omitempty"`
	RecentKept int        `json:"recent_kept"`
}

// matches reports whether caller may see t and q selects it.
func (q *TurnQuery) matches(caller Caller, t *Turn) bool {
	if q.Platform != "" && t.Ref.Platform != q.Platform {
		return false
	}
	if q.Outcome != "" && outcome(t) != q.Outcome {
		return false
	}
	var seen, team, fn bool
	for i := range t.Calls {
		c := &t.Calls[i]
		if !caller.Sees(c.Team) {
			continue
		}
		seen = true
		team = team || q.Team == "" || c.Team == q.Team
		fn = fn || q.Function == "" || c.Name == q.Function
	}
	return (seen || caller.Admin && len(t.Calls) == 0) && (team || q.Team == "") && (fn || q.Function == "")
}

func outcome(t *Turn) string {
	switch {
	case t.Open():
		return "open"
	case t.State == TurnFailed:
		return "failed"
	case t.Outcome().CutOff:
		return "cut_off"
	}
	return string(t.State)
}

// view is t as caller sees it, without its calls' results.
func view(caller Caller, t *Turn, now time.Time) TurnView {
	o := t.Outcome()
	v := TurnView{Key: t.Key, Platform: t.Ref.Platform, Object: t.Ref.String(), ObjectID: objectID(t.Ref, t.Scope), State: t.State,
		Outcome: outcome(t), CreatedAt: t.CreatedAt, Deadline: t.Deadline, ExpiresAt: t.ExpiresAt,
		BudgetMS: t.Deadline.Sub(t.CreatedAt).Milliseconds(), Error: o.Error, Owner: o.Owner, TraceID: t.Trace.TraceID(),
		Teams: []string{}, Functions: []string{}}
	for i := range t.Calls {
		c := &t.Calls[i]
		if !caller.Sees(c.Team) {
			v.OtherCalls++
			continue
		}
		if !slices.Contains(v.Teams, c.Team) {
			v.Teams = append(v.Teams, c.Team)
		}
		if !slices.Contains(v.Functions, c.Name) {
			v.Functions = append(v.Functions, c.Name)
		}
	}
	if t.Open() {
		left := t.Deadline.Sub(now)
		v.TimeLeftMS, v.TimeLeft = left.Milliseconds(), left.Round(time.Second).String()
	}
	if !o.SubmittedAt.IsZero() {
		v.SubmittedAt = o.SubmittedAt
		v.Duration = o.SubmittedAt.Sub(t.CreatedAt).Round(time.Millisecond).String()
		v.TimeLeftAtSubmit = t.ExpiresAt.Sub(o.SubmittedAt).Round(time.Second).String()
	}
	return v
}

func objectID(r Ref, scope string) string {
	switch r.Platform {
	case protocol.PlatformAgents:
		return r.SessionID
	case protocol.PlatformAssistants:
		return r.RunID
	case protocol.PlatformMCP:
		return scope // mcp/<the call's id>: an MCP call has no platform object
	}
	return r.ResponseID
}

// traceID is the trace of a W3C traceparent ("00-<trace>-<span>-<flags>").
// callReports reports each call of t and its result, as far as recorded.
func (d *Dispatcher) callReports(ctx context.Context, t *Turn) []CallReport {
	out := make([]CallReport, 0, len(t.Calls))
	for i := range t.Calls {
		c := &t.Calls[i]
		cr := CallReport{ID: c.ID, Function: c.Name, Team: c.Team, Result: "pending"}
		if timedOut(t, c.Key) {
			cr.Result = "timed_out"
		} else if res, err := d.gather.result(ctx, t, c); err == nil {
			cr.describe(res)
		} else if !t.Open() && errors.Is(err, jetstream.ErrMsgNotFound) && time.Now().After(t.keepUntil()) {
			cr.Result = "expired" // its Nats-TTL removed it (retention.go)
		}
		out = append(out, cr)
	}
	return out
}

// seenCalls is calls as caller may see them (as AnswerWatchStatus shows them).
func seenCalls(caller Caller, calls []CallReport) []CallReport {
	out := make([]CallReport, len(calls))
	for i, c := range calls {
		if caller.Sees(c.Team) {
			out[i] = c
		} else {
			out[i] = CallReport{ID: c.ID, Function: c.Function, Team: c.Team, Result: c.Result, Redacted: true}
		}
	}
	return out
}

// stragglers names the calls of open turn t still without a result.
func (d *Dispatcher) stragglers(ctx context.Context, caller Caller, t *Turn) []string {
	var out []string
	for _, c := range seenCalls(caller, d.callReports(ctx, t)) {
		switch {
		case c.Result != "pending":
		case c.Redacted:
			out = append(out, c.Function)
		default:
			out = append(out, c.Function+"/"+c.ID)
		}
	}
	return out
}

// ErrOutOfScope means what was asked for belongs to teams the caller does
// not see: the API answers 403.
var ErrOutOfScope = errors.New("dispatch: out of the caller's scope")

// InspectTurns lists the open and recently closed turns caller may see
// that q selects, from this replica's index (started on first use; see
// inspector). It costs JetStream nothing once the index is loaded, but the
// results of recently closed turns not shown before.
func (d *Dispatcher) InspectTurns(ctx context.Context, caller Caller, q TurnQuery) (*TurnList, error) {
	if err := d.inspect.ensure(ctx); err != nil {
		return nil, err
	}
	limit := q.Limit
	if limit == 0 {
		limit = DefaultTurnLimit
	}
	now := time.Now()
	in := d.inspect
	list := &TurnList{Now: now, Open: []TurnView{}, RecentKept: recentTurns}
	var open []*Turn
	var recent []*recentTurn
	in.mu.RLock()
	if q.Outcome == "" || q.Outcome == "open" {
		for _, ot := range in.open {
			if q.matches(caller, ot.turn) {
				open = append(open, ot.turn)
			}
		}
	}
	if !q.OpenOnly && q.Outcome != "open" {
		for _, rt := range in.recent.newest() {
			if q.matches(caller, rt.turn) {
				recent = append(recent, rt)
				if limit > 0 && len(recent) == limit {
					break
				}
			}
		}
	}
	in.mu.RUnlock()
	list.OpenTotal = len(open)
	open = nearestDeadline(open, limit)
	for i, t := range open {
		v := view(caller, t, now)
		if i < stragglerTurns {
			v.Waiting = d.stragglers(ctx, caller, t)
		}
		list.Open = append(list.Open, v)
	}
	if !q.OpenOnly {
		list.Recent = []TurnView{}
	}
	for _, rt := range recent {
		v := view(caller, rt.turn, now)
		v.Calls = seenCalls(caller, in.closedCalls(ctx, rt))
		list.Recent = append(list.Recent, v)
	}
	return list, nil
}

// closedCalls returns the call reports of a closed turn, reading its
// results the first time they are asked for.
func (in *inspector) closedCalls(ctx context.Context, rt *recentTurn) []CallReport {
	in.mu.RLock()
	calls, t := rt.calls, rt.turn
	in.mu.RUnlock()
	if calls != nil {
		return calls
	}
	calls = in.d.callReports(ctx, t)
	in.mu.Lock()
	if rt.turn == t {
		rt.calls = calls
	}
	in.mu.Unlock()
	return calls
}

// InspectTurn returns one turn, with each call's result as far as
// recorded, as caller may see it: an error wrapping ErrNotFound if there is
// no such turn, ErrOutOfScope if none of its calls is caller's to see.
func (d *Dispatcher) InspectTurn(ctx context.Context, caller Caller, key protocol.TurnKey) (*TurnView, error) {
	if err := key.Validate(); err != nil {
		return nil, &FieldError{Field: "key", Message: err.Error()}
	}
	t, err := d.Turn(ctx, key)
	if err != nil {
		return nil, err
	}
	if !(&TurnQuery{}).matches(caller, t) {
		return nil, fmt.Errorf("%w: turn %s calls no function of your teams (%s)", ErrOutOfScope, key, strings.Join(caller.Teams, ", "))
	}
	v := view(caller, t, time.Now())
	v.Calls = seenCalls(caller, d.callReports(ctx, t))
	return &v, nil
}

// byDeadline orders turns nearest their deadline first, then by key.
func byDeadline(a, b *Turn) int {
	return cmp.Or(a.Deadline.Compare(b.Deadline), cmp.Compare(a.Key, b.Key))
}

// nearestDeadline returns the limit turns of open nearest their deadline
// (all of them if limit is 0 or less), in that order; it reorders open.
// With many open turns and a page of a few hundred, it keeps the page
// found so far as a heap whose top is the farthest of it, so that most
// turns cost one comparison with that top: sorting them all made a list
// of 100,000 open turns take a third of a second.
func nearestDeadline(open []*Turn, limit int) []*Turn {
	if limit <= 0 || len(open) <= limit {
		slices.SortFunc(open, byDeadline)
		return open
	}
	h := turnHeap(open[:limit])
	heap.Init(&h)
	for _, t := range open[limit:] {
		if byDeadline(t, h[0]) < 0 {
			h[0] = t
			heap.Fix(&h, 0)
		}
	}
	slices.SortFunc(h, byDeadline)
	return h
}

// turnHeap is a max-heap of turns by byDeadline: its top is the turn
// farthest from its deadline.
type turnHeap []*Turn

func (h turnHeap) Len() int           { return len(h) }
func (h turnHeap) Less(i, j int) bool { return byDeadline(h[i], h[j]) > 0 }
func (h turnHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *turnHeap) Push(x any)        { *h = append(*h, x.(*Turn)) }
func (h *turnHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	*h = old[:len(old)-1]
	return t
}
