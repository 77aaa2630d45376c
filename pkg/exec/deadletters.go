package exec

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// DefaultReplayTimeout is the deadline of a replayed call, from now, when
// [DeadLetters.Replay] is given none.
const DefaultReplayTimeout = 5 * time.Minute

// DeadLetters reads the dead letters executors leave (calls that failed
// for good, and the outcomes of their replays) and replays them. It holds
// no state beyond js and is safe for concurrent use.
type DeadLetters struct {
	js jetstream.JetStream
}

// NewDeadLetters returns the dead letters kept on js.
func NewDeadLetters(js jetstream.JetStream) *DeadLetters {
	return &DeadLetters{js: js}
}

// List returns the dead letters (and replay outcomes) recorded for team, or
// for every team when team is empty, oldest first. It reads every record of
// those teams; to find one call, use Get.
func (d *DeadLetters) List(ctx context.Context, team string) ([]*protocol.DeadLetter, error) {
	filter := protocol.DeadLetterSubjectPrefix + ".>"
	if team != "" {
		if err := protocol.ValidateTeamName(team); err != nil {
			return nil, fmt.Errorf("exec: dead letters: %w", err)
		}
		filter = protocol.DeadLetterSubjectPrefix + "." + team + ".>"
	}
	s, err := d.stream(ctx)
	if s == nil || err != nil {
		return nil, err
	}
	return readDeadLetters(ctx, s, filter, func(*protocol.DeadLetter) bool { return true })
}

// Get returns the dead letter of the call with key (not its replays'
// outcomes). It finds it by subject, reading no other call's records.
// The error is ErrNoDeadLetter when there is none.
func (d *DeadLetters) Get(ctx context.Context, key protocol.CallKey) (*protocol.DeadLetter, error) {
	orig, _, err := d.lookup(ctx, key)
	return orig, err
}

// Replay runs a dead-lettered call again, on purpose: an operator fixed
// what made it fail. The call goes back to its function's executors with a
// deadline timeout from now (DefaultReplayTimeout when timeout <= 0); it
// runs even for side-effect functions, and its outcome is recorded as a new
// dead-letter record with Replay set (the turn it belonged to is long
// closed). It returns the replay number, from 1. The error is
// ErrNoDeadLetter when the call has no dead letter.
func (d *DeadLetters) Replay(ctx context.Context, key protocol.CallKey, timeout time.Duration) (int, error) {
	if timeout <= 0 {
		timeout = DefaultReplayTimeout
	}
	orig, replays, err := d.lookup(ctx, key)
	if err != nil {
		return 0, err
	}
	n := replays + 1
	call := *orig.Call
	call.Deadline = time.Now().Add(timeout).UTC()
	data, err := protocol.EncodeCall(&call)
	if err != nil {
		return 0, fmt.Errorf("exec: replay %s: %w", key, err)
	}
	m := nats.NewMsg(call.Subject())
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(call.Key))
	m.Header.Set(protocol.HeaderReplay, strconv.Itoa(n))
	if _, err := d.js.PublishMsg(ctx, m, jetstream.WithMsgID(fmt.Sprintf("%s.replay%d", call.Key, n)), jetstream.WithMsgTTL(timeout+time.Minute)); err != nil {
		return 0, fmt.Errorf("exec: replay %s: %w", key, err)
	}
	return n, nil
}

// lookup finds the dead letter of key and the number of its latest
// replay. Records are kept per call (see deadLetterSubject): the first on
// the call's subject is its dead letter and the last carries the latest
// replay number, both read by a direct get on that subject. Records kept
// before that layout, on the function's subject alone, are searched only
// while any remain (they age out with the stream's MaxAge).
func (d *DeadLetters) lookup(ctx context.Context, key protocol.CallKey) (*protocol.DeadLetter, int, error) {
	if err := key.Validate(); err != nil {
		return nil, 0, fmt.Errorf("exec: dead letter: %w", err)
	}
	s, err := d.stream(ctx)
	if err != nil {
		return nil, 0, err
	}
	if s == nil {
		return nil, 0, fmt.Errorf("%w %s", ErrNoDeadLetter, key)
	}
	subject := deadLetterCallSubject("*", "*", key)
	var orig *protocol.DeadLetter
	replays := 0
	first, err := decodeRecord(s.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(subject)))
	if err != nil {
		return nil, 0, err
	}
	if first != nil {
		last, err := decodeRecord(s.GetLastMsgForSubject(ctx, subject))
		if err != nil {
			return nil, 0, err
		}
		replays = last.Replay
		if first.Replay == 0 {
			orig = first
		}
	}
	if orig == nil {
		// Not under the per-call layout: look in the old one.
		old, err := readOldLayout(ctx, s, key)
		if err != nil {
			return nil, 0, err
		}
		for _, r := range old {
			if r.Replay == 0 {
				orig = r
			}
			replays = max(replays, r.Replay)
		}
	}
	if orig == nil {
		return nil, 0, fmt.Errorf("%w %s", ErrNoDeadLetter, key)
	}
	return orig, replays, nil
}

// stream returns the dead-letter stream, or nil when none exists yet.
func (d *DeadLetters) stream(ctx context.Context) (jetstream.Stream, error) {
	s, err := d.js.Stream(ctx, protocol.DeadLetterStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	return s, nil
}

// decodeRecord decodes the record a get returned, or nil when there is
// none.
func decodeRecord(m *jetstream.RawStreamMsg, err error) (*protocol.DeadLetter, error) {
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("exec: dead letter: %w", err)
	}
	dl, err := protocol.DecodeDeadLetter(m.Data)
	if err != nil {
		return nil, fmt.Errorf("exec: dead letter at %s: %w", m.Subject, err)
	}
	return dl, nil
}

// readOldLayout returns key's records kept on its function's subject
// alone (fndlq.<team>.<function>), the layout before per-call subjects.
// It reads nothing when no such record is left.
func readOldLayout(ctx context.Context, s jetstream.Stream, key protocol.CallKey) ([]*protocol.DeadLetter, error) {
	filter := protocol.DeadLetterSubjectPrefix + ".*.*"
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	if len(info.State.Subjects) == 0 {
		return nil, nil
	}
	return readDeadLetters(ctx, s, filter, func(d *protocol.DeadLetter) bool { return d.Call.Key == key })
}

// readDeadLetters reads the records on filter that keep says to keep,
// oldest first, skipping what does not decode.
func readDeadLetters(ctx context.Context, s jetstream.Stream, filter string, keep func(*protocol.DeadLetter) bool) ([]*protocol.DeadLetter, error) {
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	pending := int(c.CachedInfo().NumPending)
	var out []*protocol.DeadLetter
	for read := 0; read < pending; {
		batch, err := c.Fetch(min(pending-read, 256), jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			return nil, fmt.Errorf("exec: dead letters: %w", err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			d, err := protocol.DecodeDeadLetter(m.Data())
			if err != nil {
				continue // not ours to judge; skip what does not decode
			}
			if keep(d) {
				out = append(out, d)
			}
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("exec: dead letters: %w", err)
		}
		if n == 0 {
			break
		}
		read += n
	}
	return out, nil
}
