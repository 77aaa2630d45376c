package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A watch is the dispatcher driving a platform object it cannot learn of
// by webhook: it polls the object, takes in each required action as a turn,
// and for Responses follows each continuation, until the object is done.

// WatchState is where a watch is.
type WatchState string

// Watch states.
const (
	WatchActive    WatchState = "watching"
	WatchCompleted WatchState = "completed"
	WatchFailed    WatchState = "failed"
	// WatchUnsupported: the object waits on, or ended on, something
	// toolrelay does not serve (Watch.Unsupported names it). A response
	// that ended so cannot move on, and its watch ends in this state. An
	// Agents session or an Assistants run can, once someone else answers:
	// its record stays "watching" and its driver goes on polling, and
	// WatchStatus reports it as "unsupported" until the object moves.
	WatchUnsupported WatchState = "unsupported"
)

// Watch is the record of a watch, kept in the watch bucket.
type Watch struct {
	ID string `json:"id"`
	// Ref is what was asked for; Current what is driven now (a Responses
	// continuation moves it).
	Ref     Ref                `json:"ref"`
	Current Ref                `json:"current"`
	State   WatchState         `json:"state"`
	Turns   []protocol.TurnKey `json:"turns"`
	Answer  string             `json:"answer,omitempty"`
	Error   string             `json:"error,omitempty"`
	// Unsupported lists what the object waits on (or ended on) that
	// toolrelay does not serve; empty when there is nothing.
	Unsupported []UnsupportedItem `json:"unsupported,omitempty"`
	CreatedAt   time.Time         `json:"created_at"`
	UpdatedAt   time.Time         `json:"updated_at"`
	// Trace is the W3C context the watch request carried; its turns'
	// spans are its children.
	Trace TraceContext `json:"trace,omitzero"`
	// Released says the replica driving the watch stopped and left it for
	// any other to take at its next sweep.
	Released bool `json:"released,omitempty"`
	// Driver is the replica that drives the watch (its Options.Name).
	// Empty in records written before replicas named themselves.
	Driver string `json:"driver,omitempty"`
}

// existsCheckTimeout bounds how long Watch waits for the platform to say
// whether the object exists; without an answer in time the watch starts.
const existsCheckTimeout = 5 * time.Second

// watchID is stable per object, so asking twice to watch the same object
// yields the same watch.
func watchID(ref Ref) string {
	b, _ := json.Marshal(ref)
	sum := sha256.Sum256(b)
	return "w_" + hex.EncodeToString(sum[:12])
}

// Watch starts driving ref and returns its record, a snapshot: the
// driver goes on changing its own copy, which WatchStatus reads. Watching
// an object that is already watched returns the existing watch.
//
// The platform is asked for the object first (up to existsCheckTimeout):
// if it answers 404, Watch returns a *FieldError wrapping
// ErrObjectNotFound and records nothing. Any other failure to read it (a
// 5xx, a 429, no answer) is no verdict: the watch starts, and its driver
// keeps polling and reports what the platform says.
func (d *Dispatcher) Watch(ctx context.Context, ref Ref) (*Watch, error) {
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	p, ok := d.platforms[ref.Platform]
	if !ok {
		return nil, &FieldError{Field: "platform", Message: fmt.Sprintf("platform %q is not configured on this dispatcher", ref.Platform)}
	}
	if !d.Ready() {
		return nil, ErrNotRunning
	}
	if err := d.checkExists(ctx, p, ref); err != nil {
		return nil, err
	}
	id := watchID(ref)
	now := time.Now().UTC()
	w := &Watch{ID: id, Ref: ref, Current: ref, State: WatchActive, CreatedAt: now, UpdatedAt: now, Driver: d.opts.Name}
	if trace.SpanContextFromContext(ctx).IsValid() {
		d.tel.prop.Inject(ctx, &w.Trace)
	}
	have, err := whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (*Watch, error) { return d.recordWatch(ctx, w) })
	if err != nil {
		return nil, fmt.Errorf("dispatch: record watch: %w", err)
	}
	if have != nil {
		return have, nil
	}
	d.indexResponse(ctx, ref.ResponseID, id)
	snapshot := *w // the driver owns w from here on
	if !d.startDriver(w) {
		return nil, ErrNotRunning
	}
	return &snapshot, nil
}

// checkExists polls ref's object once and returns an error wrapping
// ErrObjectNotFound if the platform answers 404; nil otherwise.
func (d *Dispatcher) checkExists(ctx context.Context, p Platform, ref Ref) error {
	ctx, cancel := context.WithTimeout(ctx, existsCheckTimeout)
	defer cancel()
	_, err := p.Poll(ctx, ref)
	var pe *PlatformError
	if !errors.As(err, &pe) || pe.StatusCode != http.StatusNotFound {
		if err != nil {
			d.log.WarnContext(ctx, "could not tell whether the watched object exists; watching it anyway", "ref", ref.String(), "err", err)
		}
		return nil
	}
	answer := "404"
	if pe.Err != nil {
		answer = pe.Err.Error()
	}
	field, id := ref.objectField(answer)
	return &FieldError{Field: field, Err: ErrObjectNotFound,
		Message: fmt.Sprintf("%s %q does not exist on the platform (it answered: %s)", field, id, answer)}
}

// objectField names the request field (and its value) of the object a 404
// with message msg is about. For Assistants the thread and the run are
// told apart by the message, read without the ids themselves.
func (r *Ref) objectField(msg string) (field, id string) {
	switch r.Platform {
	case protocol.PlatformAgents:
		return "session_id", r.SessionID
	case protocol.PlatformAssistants:
		msg = strings.NewReplacer(r.ThreadID, "", r.RunID, "").Replace(msg)
		if strings.Contains(strings.ToLower(msg), "thread") {
			return "thread_id", r.ThreadID
		}
		return "run_id", r.RunID
	}
	if r.ResponseID == "" {
		return "conversation", r.Conversation
	}
	return "response_id", r.ResponseID
}

// recordWatch stores w unless an active watch of the same object is
// already recorded, which it returns instead. Repeating it is harmless: a
// record an earlier attempt stored (same creation time) counts as stored.
func (d *Dispatcher) recordWatch(ctx context.Context, w *Watch) (*Watch, error) {
	for {
		e, err := d.watches.Get(ctx, w.ID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			b, _ := json.Marshal(w)
			if _, err = d.watches.Create(ctx, w.ID, b); errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			return nil, err
		}
		if err != nil {
			return nil, err
		}
		var have Watch
		if json.Unmarshal(e.Value(), &have) == nil && have.State == WatchActive && time.Since(have.UpdatedAt) < watchStaleAfter {
			if have.CreatedAt.Equal(w.CreatedAt) {
				return nil, nil // stored by an earlier attempt of ours
			}
			return &have, nil
		}
		b, _ := json.Marshal(w)
		if _, err = d.watches.Update(ctx, w.ID, b, e.Revision()); errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		return nil, err
	}
}

// WatchStatus returns the record of a watch; an error wrapping ErrNotFound
// if there is none.
func (d *Dispatcher) WatchStatus(ctx context.Context, id string) (*Watch, error) {
	e, err := d.watches.Get(ctx, id)
	if err != nil {
		return nil, notFound("watch", id, err)
	}
	var w Watch
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		return nil, fmt.Errorf("dispatch: decode watch %s: %w", id, err)
	}
	w.State = w.reported()
	return &w, nil
}

// reported is the state a watch is reported in: an object still driven
// that waits on something toolrelay does not serve reads "unsupported",
// not "watching", whatever its record keeps for its driver.
func (w *Watch) reported() WatchState {
	if w.State == WatchActive && len(w.Unsupported) > 0 {
		return WatchUnsupported
	}
	return w.State
}

// canMoveOn reports whether ref's object can move on after waiting on
// something toolrelay does not serve: a session or a run waits for someone
// else to answer it; a response that ended so never changes.
func (r *Ref) canMoveOn() bool { return r.Platform != protocol.PlatformResponses }

// Turn returns the record of a turn; an error wrapping ErrNotFound if
// there is none.
func (d *Dispatcher) Turn(ctx context.Context, key protocol.TurnKey) (*Turn, error) {
	t, _, err := d.turns.get(ctx, key)
	if err != nil {
		return nil, notFound("turn", string(key), err)
	}
	return t, nil
}
