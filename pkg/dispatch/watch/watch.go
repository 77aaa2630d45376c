package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/jsretry"
	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Service drives the watches of one dispatcher replica. It is safe for
// concurrent use.
type Service struct {
	d   *dispatch.Dispatcher
	js  jetstream.JetStream
	log *slog.Logger
	// name is the replica's Options.Name, which it writes as the driver
	// of the watches it drives.
	name string
	// buckets are bound by Serve, once Run has provisioned them.
	buckets atomic.Pointer[buckets]

	mu      sync.Mutex
	driving map[string]bool // the watches this replica drives

	// saveEvery is how often a driver saves its watch to show it is alive
	// (tests shorten it); unavailableFor how long a save or a request
	// waits for JetStream to come back.
	saveEvery, unavailableFor time.Duration
}

// buckets are the KV buckets a Service reads and writes.
type buckets struct {
	// watches holds each watch's record, keyed by its id.
	watches jetstream.KeyValue
	// responses maps each response a watch drives to the watch's id (for
	// the response.completed webhook).
	responses jetstream.KeyValue
}

var _ dispatch.WatchDriver = (*Service)(nil)

// New returns the driver of d's watches and attaches it to d
// ([dispatch.Dispatcher.AttachWatchDriver]): from then on d.Watch starts
// watches, d.Run serves the watch API on NATS and hands this replica's
// watches over when it stops, and its sweep takes over the watches of
// replicas that stopped. js is the JetStream d was made with. Call it once
// per Dispatcher, before Run.
func New(d *dispatch.Dispatcher, js jetstream.JetStream) *Service {
	opts := d.Options()
	s := &Service{d: d, js: js, log: opts.Logger.With("dispatcher", opts.Name), name: opts.Name,
		driving: map[string]bool{}, saveEvery: saveEvery, unavailableFor: jsretry.UnavailableFor}
	d.AttachWatchDriver(s)
	return s
}

// Watch starts driving ref; see [dispatch.Dispatcher.Watch], which calls
// it.
func (s *Service) Watch(ctx context.Context, ref dispatch.Ref) (*dispatch.Watch, error) {
	if err := ref.Validate(); err != nil {
		return nil, err
	}
	p, ok := s.d.Platform(ref.Platform)
	if !ok {
		return nil, &dispatch.FieldError{Field: "platform", Message: fmt.Sprintf("platform %q is not configured on this dispatcher", ref.Platform)}
	}
	b := s.buckets.Load()
	if !s.d.Ready() || b == nil {
		return nil, dispatch.ErrNotRunning
	}
	if err := s.checkExists(ctx, p, ref); err != nil {
		return nil, err
	}
	id := watchID(ref)
	now := time.Now().UTC()
	w := &dispatch.Watch{ID: id, Ref: ref, Current: ref, State: dispatch.WatchActive, CreatedAt: now, UpdatedAt: now, Driver: s.name}
	if trace.SpanContextFromContext(ctx).IsValid() {
		otelconv.Propagator.Inject(ctx, &w.Trace)
	}
	have, err := jsretry.While(ctx, s.unavailableFor, dispatch.ErrUnavailable, func(ctx context.Context) (*dispatch.Watch, error) {
		return recordWatch(ctx, b.watches, w)
	})
	if err != nil {
		return nil, fmt.Errorf("watch: record watch: %w", err)
	}
	if have != nil {
		return have, nil
	}
	s.indexResponse(ctx, ref.ResponseID, id)
	snapshot := *w // the driver owns w from here on
	if !s.startDriver(w) {
		return nil, dispatch.ErrNotRunning
	}
	return &snapshot, nil
}

// existsCheckTimeout bounds how long Watch waits for the platform to say
// whether the object exists; without an answer in time the watch starts.
const existsCheckTimeout = 5 * time.Second

// watchID is stable per object, so asking twice to watch the same object
// yields the same watch.
func watchID(ref dispatch.Ref) string {
	b, _ := json.Marshal(ref)
	sum := sha256.Sum256(b)
	return "w_" + hex.EncodeToString(sum[:12])
}

// checkExists polls ref's object once and returns an error wrapping
// ErrObjectNotFound if the platform answers 404; nil otherwise.
func (s *Service) checkExists(ctx context.Context, p dispatch.Platform, ref dispatch.Ref) error {
	ctx, cancel := context.WithTimeout(ctx, existsCheckTimeout)
	defer cancel()
	_, err := p.Poll(ctx, ref)
	var pe *dispatch.PlatformError
	if !errors.As(err, &pe) || pe.StatusCode != http.StatusNotFound {
		if err != nil {
			s.log.WarnContext(ctx, "could not tell whether the watched object exists; watching it anyway", "ref", ref.String(), "err", err)
		}
		return nil
	}
	answer := "404"
	if pe.Err != nil {
		answer = pe.Err.Error()
	}
	field, id := objectField(ref, answer)
	return &dispatch.FieldError{Field: field, Err: dispatch.ErrObjectNotFound,
		Message: fmt.Sprintf("%s %q does not exist on the platform (it answered: %s)", field, id, answer)}
}

// objectField names the request field (and its value) of the object a 404
// with message msg is about. For Assistants the thread and the run are
// told apart by the message, read without the ids themselves.
func objectField(r dispatch.Ref, msg string) (field, id string) {
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
func recordWatch(ctx context.Context, kv jetstream.KeyValue, w *dispatch.Watch) (*dispatch.Watch, error) {
	for {
		e, err := kv.Get(ctx, w.ID)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			b, _ := json.Marshal(w)
			if _, err = kv.Create(ctx, w.ID, b); errors.Is(err, jetstream.ErrKeyExists) {
				continue
			}
			return nil, err
		}
		if err != nil {
			return nil, err
		}
		var have dispatch.Watch
		if json.Unmarshal(e.Value(), &have) == nil && have.State == dispatch.WatchActive && time.Since(have.UpdatedAt) < staleAfter {
			if have.CreatedAt.Equal(w.CreatedAt) {
				return nil, nil // stored by an earlier attempt of ours
			}
			return &have, nil
		}
		b, _ := json.Marshal(w)
		if _, err = kv.Update(ctx, w.ID, b, e.Revision()); errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		return nil, err
	}
}

// canMoveOn reports whether ref's object can move on after waiting on
// something toolrelay does not serve: a session or a run waits for someone
// else to answer it; a response that ended so never changes.
func canMoveOn(ref dispatch.Ref) bool { return ref.Platform != protocol.PlatformResponses }

// Response returns the object a response a watch drives belongs to: the
// current object of that watch. ok is false when no watch drives it.
func (s *Service) Response(ctx context.Context, responseID string) (ref dispatch.Ref, ok bool, err error) {
	b := s.buckets.Load()
	if b == nil {
		return dispatch.Ref{}, false, dispatch.ErrNotRunning
	}
	e, err := b.responses.Get(ctx, responseKey(responseID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return dispatch.Ref{}, false, nil
	}
	if err != nil {
		return dispatch.Ref{}, false, err
	}
	w, err := s.d.WatchStatus(ctx, string(e.Value()))
	if err != nil {
		return dispatch.Ref{}, false, err
	}
	return w.Current, true, nil
}

// indexResponse records that the watch watchID drives a response.
func (s *Service) indexResponse(ctx context.Context, responseID, watchID string) {
	b := s.buckets.Load()
	if responseID == "" || b == nil {
		return
	}
	if _, err := b.responses.Put(ctx, responseKey(responseID), []byte(watchID)); err != nil {
		s.log.WarnContext(ctx, "indexing a driven response failed", "response", responseID, "err", err)
	}
}

// responseKey keeps IDs usable as KV keys: platform IDs are alphanumeric
// with _ and -, which KV accepts; anything else is hashed.
func responseKey(id string) string {
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			sum := sha256.Sum256([]byte(id))
			return hex.EncodeToString(sum[:16])
		}
	}
	return id
}

// bind binds the buckets Run provisioned.
func (s *Service) bind(ctx context.Context) error {
	watches, err := s.js.KeyValue(ctx, provision.WatchBucket)
	if err != nil {
		return fmt.Errorf("watch: the watch bucket: %w", err)
	}
	responses, err := s.js.KeyValue(ctx, provision.ResponseBucket)
	if err != nil {
		return fmt.Errorf("watch: the response bucket: %w", err)
	}
	s.buckets.Store(&buckets{watches: watches, responses: responses})
	return nil
}
