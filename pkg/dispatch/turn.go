package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// TurnState is where a turn is in its life. It only moves forward:
// collecting → submitting → submitted | failed, by compare-and-set.
type TurnState = lifecycle.State

// Turn states.
const (
	TurnCollecting = lifecycle.Collecting
	TurnSubmitting = lifecycle.Submitting
	TurnSubmitted  = lifecycle.Submitted
	TurnFailed     = lifecycle.Failed
)

// Turn is the dispatcher's record of one turn, kept in the turn bucket so
// that any replica can finish it and a restarted one resumes it.
type Turn struct {
	Version int              `json:"v"`
	Key     protocol.TurnKey `json:"key"`
	Ref     Ref              `json:"ref"`
	Scope   string           `json:"scope"`
	TurnID  string           `json:"turn_id,omitempty"`
	State   TurnState        `json:"state"`
	Calls   []TurnCall       `json:"calls"`
	// CreatedAt is when the dispatcher took the turn in.
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when the platform expires the run; Deadline is when the
	// dispatcher submits whatever it has (ExpiresAt minus the margin).
	ExpiresAt time.Time `json:"expires_at"`
	Deadline  time.Time `json:"deadline"`
	// Trace carries the turn span's W3C context (traceparent, tracestate),
	// so any replica parents its spans under it.
	Trace TraceContext `json:"trace,omitzero"`
	// lease says which process may submit the turn (docs/turns.md).
	lease lifecycle.Lease
	// out is how the turn is being closed: nil while it collects, which
	// keeps the many turns in flight a size class smaller.
	out *TurnOutcome
}

// TurnOutcome is how a turn is closed: who owns its submission, since
// when, and what came of it.
type TurnOutcome struct {
	// Owner is the replica that holds, or held, the turn's lease, since
	// SubmittingSince (when it last wrote the lease).
	Owner           string    `json:"owner,omitempty"`
	SubmittingSince time.Time `json:"submitting_since,omitzero"`
	SubmittedAt     time.Time `json:"submitted_at,omitzero"`
	// CutOff is set when the deadline, not the last result, closed the
	// turn; TimedOut lists the calls submitted as timed out.
	CutOff   bool               `json:"cut_off,omitempty"`
	TimedOut []protocol.CallKey `json:"timed_out,omitempty"`
	Error    string             `json:"error,omitempty"`
	// Next is what the submission created to drive next (Responses).
	Next *Ref `json:"next,omitempty"`
}

// Outcome returns how the turn is being closed, or was; while it
// collects, only who owns it, if any process does.
func (t *Turn) Outcome() TurnOutcome {
	var o TurnOutcome
	if t.out != nil {
		o = *t.out
	}
	if t.lease.Owner != "" {
		o.Owner = leaseName(t.lease.Owner)
		o.SubmittingSince = t.lease.Until.Add(-lifecycle.LeaseFor)
	}
	return o
}

// writeOutcome returns the turn's outcome for changing, made if it has
// none. A turn copied with clone has its own.
func (t *Turn) writeOutcome() *TurnOutcome {
	if t.out == nil {
		t.out = new(TurnOutcome)
	}
	return t.out
}

// clone returns a copy of t whose outcome can be changed without changing
// t's. The calls, shared, are never changed in place.
func (t *Turn) clone() *Turn {
	c := *t
	if t.out != nil {
		o := *t.out
		c.out = &o
	}
	return &c
}

// MarshalJSON writes the turn's record.
func (t Turn) MarshalJSON() ([]byte, error) { return appendTurn(nil, &t) }

// UnmarshalJSON reads a turn's record, as this version or an earlier one
// wrote it (record.go).
func (t *Turn) UnmarshalJSON(b []byte) error {
	w := recordWire{turnFields: (*turnFields)(t)}
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	w.turn(t)
	return nil
}

// TurnCall is one call of a turn.
type TurnCall struct {
	ID        string           `json:"id"`
	Name      string           `json:"name"`
	Key       protocol.CallKey `json:"key"`
	Team      string           `json:"team"`
	Arguments json.RawMessage  `json:"arguments"`
	// Rejected calls failed at intake and were never published.
	Rejected bool `json:"rejected,omitempty"`
	// Custom marks a custom tool call (see CallRequest.Custom).
	Custom bool `json:"custom,omitempty"`
	// ToolSearch marks a tool search the dispatcher answers itself (see
	// CallRequest.ToolSearch): never published, its result recorded at
	// intake.
	ToolSearch bool `json:"tool_search,omitempty"`
	// MCPServer, when set, marks an MCP approval request the dispatcher
	// answers itself (see CallRequest.MCPServer): never published, its
	// result is the decision.
	MCPServer string `json:"mcp_server,omitempty"`
	// Approval marks a call its function's policy held for a person's
	// decision at intake: published only once approved (approvals.go).
	Approval bool `json:"approval,omitempty"`
	// SideEffects marks a call of a side-effecting function, whose runs
	// go to the audit trail.
	SideEffects bool `json:"side_effects,omitempty"`
}

// published reports whether the call goes to executors: not one rejected
// at intake, nor a tool search or an MCP approval request the dispatcher
// answers.
func (c *TurnCall) published() bool { return !c.Rejected && !c.ToolSearch && c.MCPServer == "" }

// resultSubject is where this call's result is recorded.
func (c *TurnCall) resultSubject() string { return protocol.ResultSubject(c.Team, c.Key) }

// teams lists the teams whose result streams hold the turn's results, each
// once.
func (t *Turn) teams() []string {
	var teams []string
	for i := range t.Calls {
		if !slices.Contains(teams, t.Calls[i].Team) {
			teams = append(teams, t.Calls[i].Team)
		}
	}
	return teams
}

// Open reports whether the turn still waits for results.
func (t *Turn) Open() bool { return t.State == TurnCollecting || t.State == TurnSubmitting }

func (t *Turn) call(key protocol.CallKey) *TurnCall {
	if i := t.callIndex(key); i >= 0 {
		return &t.Calls[i]
	}
	return nil
}

// callIndex returns the index of the call with key in t.Calls, or -1.
func (t *Turn) callIndex(key protocol.CallKey) int {
	for i := range t.Calls {
		if t.Calls[i].Key == key {
			return i
		}
	}
	return -1
}

// A turn record is encoded into a pooled buffer, given back once the write
// that carries it is acknowledged. Records are written three times in a
// turn's life; without the pool each write leaves a buffer of the record's
// size behind, in the allocator's size class of the Turn held meanwhile,
// and the spans those buffers leave half empty stay resident.
var recordBuffers = sync.Pool{New: func() any { return new(recordBuffer) }}

// maxPooledRecord keeps the buffers of turns with large arguments out of
// the pool.
const maxPooledRecord = 16 << 10

// recordBuffer holds one encoded turn record.
type recordBuffer struct{ b []byte }

func encodeTurn(t *Turn) (*recordBuffer, error) {
	rb := recordBuffers.Get().(*recordBuffer)
	b, err := appendTurn(rb.b[:0], t)
	if err != nil {
		rb.release()
		return nil, fmt.Errorf("dispatch: encode turn record %s: %w", t.Key, err)
	}
	rb.b = b
	return rb, nil
}

// Bytes returns the record.
func (rb *recordBuffer) Bytes() []byte { return rb.b }

// release gives rb back to the pool; rb must not be used after.
func (rb *recordBuffer) release() {
	if cap(rb.b) <= maxPooledRecord {
		recordBuffers.Put(rb)
	}
}

func decodeTurn(b []byte) (*Turn, error) {
	var t Turn
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("dispatch: decode turn record: %w", err)
	}
	if err := t.Key.Validate(); err != nil {
		return nil, fmt.Errorf("dispatch: turn record: %w", err)
	}
	return &t, nil
}

// turnStore reads and changes turn records by compare-and-set. Changes
// are published to the bucket's subject on nc (ADR-8), as the bucket's
// own Update does, with the acknowledgement read by jspub.
type turnStore struct {
	kv jetstream.KeyValue
	nc *nats.Conn
}

// errConflict means another replica changed the record first.
var errConflict = errors.New("dispatch: turn record changed concurrently")

func (s turnStore) get(ctx context.Context, key protocol.TurnKey) (*Turn, uint64, error) {
	e, err := s.kv.Get(ctx, string(key))
	if err != nil {
		return nil, 0, err
	}
	t, err := decodeTurn(e.Value())
	return t, e.Revision(), err
}

// create stores a new record; it returns errConflict if one exists.
func (s turnStore) create(ctx context.Context, t *Turn) (uint64, error) {
	b, err := encodeTurn(t)
	if err != nil {
		return 0, err
	}
	defer b.release() // a synchronous write: done with b when it returns
	rev, err := s.kv.Create(ctx, string(t.Key), b.Bytes())
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, errConflict
	}
	return rev, err
}

// update replaces the record at revision rev; errConflict if it moved.
// The write that closes a turn carries its closedTTL.
func (s turnStore) update(ctx context.Context, t *Turn, rev uint64) (uint64, error) {
	b, err := encodeTurn(t)
	if err != nil {
		return 0, err
	}
	defer b.release() // a synchronous write: done with b when it returns
	m := &nats.Msg{Subject: kvSubject(provision.TurnBucket, string(t.Key)), Data: b.Bytes(),
		Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{strconv.FormatUint(rev, 10)}}}
	if !t.Open() {
		// A closed turn is kept for minutes (retention.go), not the
		// bucket's hours.
		m.Header[jetstream.MsgTTLHeader] = []string{t.closedTTL(time.Now()).String()}
	}
	rev, err = jspub.Publish(ctx, s.nc, m)
	if firstwins.Lost(err) {
		return 0, errConflict
	}
	return rev, err
}
