package exec

import (
	"cmp"
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
//
// It reads by direct get alone (the dead-letter stream allows them), never
// by a consumer, so it also works where only stream info and direct gets
// of the stream are allowed: from the control account of a deployment with
// an account per team, through the read-only paths dispatcher nats-config
// gives it to each team's account.
type DeadLetters struct {
	js jetstream.JetStream
	// team, when set, is the only team whose records count.
	team string
}

// NewDeadLetters returns the dead letters kept on js.
func NewDeadLetters(js jetstream.JetStream) *DeadLetters {
	return &DeadLetters{js: js}
}

// NewTeamDeadLetters returns team's dead letters kept on js: List lists
// only team's, and Get and Replay find only a dead letter whose call is
// team's, whatever subject a record is on. It is for reading a team's own
// account from the control plane: there the team writes the dead-letter
// stream itself, so it could forge a record naming another team, whose
// replay would reach that team's queue.
func NewTeamDeadLetters(js jetstream.JetStream, team string) (*DeadLetters, error) {
	if err := protocol.ValidateTeamName(team); err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	return &DeadLetters{js: js, team: team}, nil
}

// List returns the dead letters (and replay outcomes) recorded for team, or
// for every team when team is empty, oldest first. It reads every record of
// those teams, one direct get each; ListNewest reads the newest alone, and
// Get finds one call's.
func (d *DeadLetters) List(ctx context.Context, team string) ([]*protocol.DeadLetter, error) {
	return d.ListNewest(ctx, team, 0)
}

// ListNewest is List bounded to the newest n records (all of them when
// n <= 0), still oldest first. It reads back from the newest, so what it
// costs follows n, not how many records the stream keeps. Since a call's
// replays come after its dead letter, a dead letter it returns comes with
// all its replays' outcomes.
func (d *DeadLetters) ListNewest(ctx context.Context, team string, n int) ([]*protocol.DeadLetter, error) {
	team = cmp.Or(team, d.team)
	if d.team != "" && team != d.team {
		return nil, nil // another team's are not in d
	}
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
	return readRecords(ctx, s, filter, n, func(r *protocol.DeadLetter) bool { return team == "" || r.Call.Team == team })
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
	// No dispatcher reads a replay's result: it is kept while the
	// replayed call itself may be redelivered.
	call.KeepResultUntil = call.Deadline.Add(time.Minute)
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
	subject := deadLetterCallSubject(cmp.Or(d.team, "*"), "*", key)
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
		if first.Replay == 0 && d.counts(first, key) {
			orig = first
		}
	}
	if orig == nil {
		// Not under the per-call layout: look in the old one.
		old, err := d.readOldLayout(ctx, s, key)
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

// counts reports whether r is a record of key's that d may use.
func (d *DeadLetters) counts(r *protocol.DeadLetter, key protocol.CallKey) bool {
	return r.Call.Key == key && (d.team == "" || r.Call.Team == d.team)
}

// readOldLayout returns key's records kept on its function's subject
// alone (fndlq.<team>.<function>), the layout before per-call subjects.
// It reads nothing when no such record is left.
func (d *DeadLetters) readOldLayout(ctx context.Context, s jetstream.Stream, key protocol.CallKey) ([]*protocol.DeadLetter, error) {
	filter := protocol.DeadLetterSubject(cmp.Or(d.team, "*"), "*")
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	if len(info.State.Subjects) == 0 {
		return nil, nil
	}
	return readRecords(ctx, s, filter, 0, func(r *protocol.DeadLetter) bool { return d.counts(r, key) })
}

// readRecords returns the newest n records on filter (all of them when
// n <= 0) that keep accepts, oldest first, skipping what does not decode.
// It reads back from the stream's last message, a window of sequences at
// a time, doubling the window until it has n records or reached the first
// message; each window it reads forward, one direct get (next by subject)
// a record.
func readRecords(ctx context.Context, s jetstream.Stream, filter string, n int, keep func(*protocol.DeadLetter) bool) ([]*protocol.DeadLetter, error) {
	st := s.CachedInfo().State
	if st.Msgs == 0 {
		return nil, nil
	}
	if n <= 0 {
		return readRange(ctx, s, filter, st.FirstSeq, st.LastSeq, keep)
	}
	var out []*protocol.DeadLetter
	for end, window := st.LastSeq, uint64(n); len(out) < n; window *= 2 {
		start := st.FirstSeq
		if end-start >= window {
			start = end - window + 1
		}
		got, err := readRange(ctx, s, filter, start, end, keep)
		if err != nil {
			return nil, err
		}
		out = append(got, out...)
		if start == st.FirstSeq {
			break
		}
		end = start - 1
	}
	return out[max(len(out)-n, 0):], nil
}

// readRange returns the records on filter with sequences from to to that
// keep accepts, in order, skipping what does not decode.
func readRange(ctx context.Context, s jetstream.Stream, filter string, from, to uint64, keep func(*protocol.DeadLetter) bool) ([]*protocol.DeadLetter, error) {
	var out []*protocol.DeadLetter
	for seq := from; seq <= to; {
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("exec: dead letters: %w", err)
		}
		if m.Sequence > to {
			break
		}
		seq = m.Sequence + 1
		if r, err := protocol.DecodeDeadLetter(m.Data); err == nil && keep(r) {
			out = append(out, r) // what does not decode is not ours to judge
		}
	}
	return out, nil
}
