package dispatch

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A turn record is written twice in most turns' lives (taken in,
// submitted), on every turn's critical path: appendTurn writes it by hand,
// as pkg/protocol writes the envelopes (see protocol.AppendJSONString).
// Records are read back with encoding/json into recordWire;
// TestRecordEncodingMatchesJSON holds the two to the same meaning for
// every field, so a field added to Turn, Ref or TurnCall without a line
// here fails it.
//
// The lease is written in two ways: as "lease" (owner, until, epoch), which
// this version reads, and in the fields a version before the lease reads,
// so that one of them running beside this one (a rolling upgrade) leaves
// a turn alone while its lease holds:
//   - a collecting turn with an owner is written as that version's hold:
//     state submitting, held, owner and holder, and submitting_since
//     LeaseFor before the deadline (it takes a hold over only once it is
//     LeaseFor old, and then as a turn collecting);
//   - any other turn with an owner is written as its claim: owner, and
//     submitting_since LeaseFor - Skew before the lease lapses (that
//     version takes a claim over once it is LeaseFor old: when this one
//     would).
// A record that version wrote has no "lease": recordWire.turn reads its
// hold or claim as a lease of a process named "old:...", at epoch 1, so
// that a take-over of it counts as a repeat (dispatch.Repeated).

// recordWire is a turn's record as stored.
type recordWire struct {
	*turnFields
	TurnOutcome
	Held   bool       `json:"held,omitempty"`
	Holder string     `json:"holder,omitempty"`
	Lease  *wireLease `json:"lease,omitempty"`
}

// turnFields is a Turn without its methods, so that encoding/json reads
// and writes its fields.
type turnFields Turn

type wireLease struct {
	Owner string    `json:"owner,omitempty"`
	Until time.Time `json:"until,omitzero"`
	Epoch uint64    `json:"epoch,omitempty"`
}

// wire returns t's record as stored.
func (t *Turn) wire() recordWire {
	f := *t
	w := recordWire{turnFields: (*turnFields)(&f)}
	if t.out != nil {
		w.TurnOutcome = *t.out
	}
	l := t.lease
	if l.Owner != "" || l.Epoch != 0 {
		w.Lease = &wireLease{Owner: l.Owner, Until: l.Until, Epoch: l.Epoch}
	}
	if l.Owner == "" {
		return w
	}
	w.Owner = leaseName(l.Owner)
	switch t.State {
	case TurnCollecting:
		f.State = TurnSubmitting
		w.Held, w.Holder = true, leaseInstance(l.Owner)
		w.SubmittingSince = t.Deadline.Add(-lifecycle.LeaseFor)
	default:
		// That version takes a claim over LeaseFor after it; this one
		// Skew after the lease lapses: the same moment.
		w.SubmittingSince = l.Until.Add(lifecycle.Skew - lifecycle.LeaseFor)
	}
	return w
}

// turn sets t to the turn w stores.
func (w *recordWire) turn(t *Turn) {
	if w.turnFields != (*turnFields)(t) {
		*t = Turn(*w.turnFields)
	}
	o := w.TurnOutcome
	switch {
	case w.Lease != nil:
		t.lease = lifecycle.Lease{Owner: w.Lease.Owner, Until: w.Lease.Until, Epoch: w.Lease.Epoch}
	case w.Held && t.State == TurnSubmitting:
		t.lease = lifecycle.Lease{Owner: "old:" + o.Owner + "/" + w.Holder, Until: t.CreatedAt.Add(lifecycle.LeaseFor), Epoch: 1}
	case t.State == TurnSubmitting && o.Owner != "":
		t.lease = lifecycle.Lease{Owner: "old:" + o.Owner, Until: o.SubmittingSince.Add(lifecycle.LeaseFor), Epoch: 1}
	case t.State == TurnSubmitting:
		// A claim that version released: its submission may have gone
		// out, so whoever takes it repeats one (epoch 2 on).
		t.lease = lifecycle.Lease{Epoch: 1}
	}
	if w.Held && t.State == TurnSubmitting {
		t.State = TurnCollecting
	}
	if t.lease.Owner != "" {
		o.Owner, o.SubmittingSince = "", time.Time{} // the lease says
	}
	if t.out = &o; o.isZero() {
		t.out = nil
	}
}

func (o *TurnOutcome) isZero() bool {
	return o.Owner == "" && o.SubmittingSince.IsZero() && o.SubmittedAt.IsZero() && !o.CutOff &&
		o.TimedOut == nil && o.Error == "" && o.Next == nil
}

// leaseName and leaseInstance are the process name and instance of a
// lease's owner (Dispatcher.instance: "<name>/<instance>").
func leaseName(owner string) string {
	if i := strings.LastIndexByte(owner, '/'); i >= 0 {
		return owner[:i]
	}
	return owner
}

func leaseInstance(owner string) string { return owner[strings.LastIndexByte(owner, '/')+1:] }

func appendTurn(b []byte, t *Turn) ([]byte, error) {
	w := t.wire()
	var err error
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(t.Version), 10)
	b = protocol.AppendJSONField(b, "key", string(t.Key))
	b = append(b, `,"ref":`...)
	b = appendRef(b, &t.Ref)
	b = protocol.AppendJSONField(b, "scope", t.Scope)
	b = protocol.AppendJSONOptional(b, "turn_id", t.TurnID)
	b = protocol.AppendJSONField(b, "state", string(w.State))
	b = append(b, `,"calls":`...)
	if t.Calls == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range t.Calls {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendCall(b, &t.Calls[i]); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	for _, f := range [...]struct {
		name string
		at   time.Time
	}{{"created_at", t.CreatedAt}, {"expires_at", t.ExpiresAt}, {"deadline", t.Deadline}} {
		if b, err = protocol.AppendJSONTime(b, f.name, f.at); err != nil {
			return nil, err
		}
	}
	o := &w.TurnOutcome
	b = protocol.AppendJSONOptional(b, "owner", o.Owner)
	for _, f := range [...]struct {
		name string
		at   time.Time
	}{{"submitting_since", o.SubmittingSince}, {"submitted_at", o.SubmittedAt}} {
		if f.at.IsZero() {
			continue // omitzero
		}
		if b, err = protocol.AppendJSONTime(b, f.name, f.at); err != nil {
			return nil, err
		}
	}
	if o.CutOff {
		b = append(b, `,"cut_off":true`...)
	}
	if len(o.TimedOut) > 0 {
		b = append(b, `,"timed_out":[`...)
		for i, k := range o.TimedOut {
			if i > 0 {
				b = append(b, ',')
			}
			b = protocol.AppendJSONString(b, string(k))
		}
		b = append(b, ']')
	}
	b = protocol.AppendJSONOptional(b, "error", o.Error)
	if o.Next != nil {
		b = append(b, `,"next":`...)
		b = appendRef(b, o.Next)
	}
	if w.Held {
		b = append(b, `,"held":true`...)
	}
	b = protocol.AppendJSONOptional(b, "holder", w.Holder)
	if l := w.Lease; l != nil {
		b = append(b, `,"lease":{`...)
		sep := false
		if l.Owner != "" {
			b = append(protocol.AppendJSONString(b, "owner"), ':')
			b = protocol.AppendJSONString(b, l.Owner)
			sep = true
		}
		if !l.Until.IsZero() {
			if sep {
				b = append(b, ',')
			}
			ts, terr := l.Until.MarshalJSON()
			if terr != nil {
				return nil, terr
			}
			b = append(append(b, `"until":`...), ts...)
			sep = true
		}
		if l.Epoch != 0 {
			if sep {
				b = append(b, ',')
			}
			b = strconv.AppendUint(append(b, `"epoch":`...), l.Epoch, 10)
		}
		b = append(b, '}')
	}
	if !t.Trace.IsZero() {
		b = append(b, `,"trace":{`...)
		sep := false
		for _, f := range [...]struct{ name, value string }{{"baggage", t.Trace.Baggage}, {"traceparent", t.Trace.Traceparent}, {"tracestate", t.Trace.Tracestate}} {
			if f.value == "" {
				continue
			}
			if sep {
				b = append(b, ',')
			}
			sep = true
			b = append(protocol.AppendJSONString(b, f.name), ':')
			b = protocol.AppendJSONString(b, f.value)
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

func appendRef(b []byte, r *Ref) []byte {
	b = append(b, `{"platform":`...)
	b = protocol.AppendJSONString(b, string(r.Platform))
	b = protocol.AppendJSONOptional(b, "session_id", r.SessionID)
	b = protocol.AppendJSONOptional(b, "thread_id", r.ThreadID)
	b = protocol.AppendJSONOptional(b, "run_id", r.RunID)
	b = protocol.AppendJSONOptional(b, "response_id", r.ResponseID)
	b = protocol.AppendJSONOptional(b, "conversation", r.Conversation)
	b = protocol.AppendJSONOptional(b, "model", r.Model)
	if r.Agent != nil {
		b = append(b, `,"agent":{"name":`...)
		b = protocol.AppendJSONString(b, r.Agent.Name)
		b = protocol.AppendJSONOptional(b, "version", r.Agent.Version)
		b = append(b, '}')
	}
	if r.Background {
		b = append(b, `,"background":true`...)
	}
	return append(b, '}')
}

func appendCall(b []byte, c *TurnCall) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = protocol.AppendJSONString(b, c.ID)
	b = protocol.AppendJSONField(b, "name", c.Name)
	b = protocol.AppendJSONField(b, "key", string(c.Key))
	b = protocol.AppendJSONField(b, "team", c.Team)
	b, err := protocol.AppendJSONRaw(append(b, `,"arguments":`...), c.Arguments)
	if err != nil { // intake keeps nothing but JSON
		return nil, fmt.Errorf("the arguments of call %q are not JSON: %w", c.ID, err)
	}
	if c.Rejected {
		b = append(b, `,"rejected":true`...)
	}
	if c.Custom {
		b = append(b, `,"custom":true`...)
	}
	if c.ToolSearch {
		b = append(b, `,"tool_search":true`...)
	}
	b = protocol.AppendJSONOptional(b, "mcp_server", c.MCPServer)
	if c.Approval {
		b = append(b, `,"approval":true`...)
	}
	if c.SideEffects {
		b = append(b, `,"side_effects":true`...)
	}
	return append(b, '}'), nil
}
