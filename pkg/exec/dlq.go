package exec

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// ErrNoDeadLetter is returned by Replay when no dead letter has the key.
var ErrNoDeadLetter = errors.New("exec: no dead letter for that call")

// DeadLetters lists the dead letters (and replay outcomes) recorded for
// team, or for every team when team is empty, oldest first.
func DeadLetters(ctx context.Context, js jetstream.JetStream, team string) ([]*protocol.DeadLetter, error) {
	s, err := js.Stream(ctx, protocol.DeadLetterStream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	filter := protocol.DeadLetterSubjectPrefix + ".>"
	if team != "" {
		if err := protocol.ValidateTeamName(team); err != nil {
			return nil, err
		}
		filter = protocol.DeadLetterSubjectPrefix + "." + team + ".>"
	}
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{FilterSubjects: []string{filter}})
	if err != nil {
		return nil, fmt.Errorf("exec: dead letters: %w", err)
	}
	pending := c.CachedInfo().NumPending
	var out []*protocol.DeadLetter
	for uint64(len(out)) < pending {
		batch, err := c.Fetch(min(int(pending)-len(out), 256), jetstream.FetchMaxWait(5*time.Second))
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
			out = append(out, d)
		}
		if err := batch.Error(); err != nil {
			return nil, fmt.Errorf("exec: dead letters: %w", err)
		}
		if n == 0 {
			break
		}
	}
	return out, nil
}

// Replay runs a dead-lettered call again, on purpose: an operator fixed
// what made it fail. The call goes back to its function's executors with a
// new deadline timeout from now; it runs even for side-effect functions, and
// its outcome is recorded as a new dead-letter record with Replay set (the
// turn it belonged to is long closed). It returns the replay number.
func Replay(ctx context.Context, js jetstream.JetStream, key protocol.CallKey, timeout time.Duration) (int, error) {
	if err := key.Validate(); err != nil {
		return 0, err
	}
	if timeout <= 0 {
		timeout = 5 * time.Minute
	}
	all, err := DeadLetters(ctx, js, "")
	if err != nil {
		return 0, err
	}
	var orig *protocol.DeadLetter
	n := 0
	for _, d := range all {
		if d.Call.Key != key {
			continue
		}
		if d.Replay == 0 {
			orig = d
		}
		n = max(n, d.Replay)
	}
	if orig == nil {
		return 0, fmt.Errorf("%w %s", ErrNoDeadLetter, key)
	}
	n++
	call := *orig.Call
	call.Deadline = time.Now().Add(timeout).UTC()
	data, err := protocol.EncodeCall(&call)
	if err != nil {
		return 0, err
	}
	m := nats.NewMsg(call.Subject())
	m.Data = data
	m.Header.Set(protocol.HeaderCallKey, string(call.Key))
	m.Header.Set(protocol.HeaderReplay, fmt.Sprint(n))
	if _, err := js.PublishMsg(ctx, m, jetstream.WithMsgID(fmt.Sprintf("%s.replay%d", call.Key, n)), jetstream.WithMsgTTL(timeout+time.Minute)); err != nil {
		return 0, fmt.Errorf("exec: replay %s: %w", key, err)
	}
	return n, nil
}
