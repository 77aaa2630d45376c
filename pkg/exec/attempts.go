package exec

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// For side-effect functions the executor records that an attempt started
// before running it, and what became of it after (protocol.AttemptMark). A
// redelivered call whose last attempt is still marked running may have had
// its effect: it is reconciled, never blindly re-run.

type attemptState = protocol.AttemptState

const (
	attemptRunning   = protocol.AttemptRunning
	attemptRetryable = protocol.AttemptRetryable
)

type attempts struct{ kv jetstream.KeyValue }

// mayHaveRun reports whether an earlier attempt of the call started and
// did not end in a known state.
func (a attempts) mayHaveRun(ctx context.Context, key protocol.CallKey) (bool, error) {
	e, err := a.kv.Get(ctx, protocol.AttemptKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m, err := protocol.DecodeAttemptMark(e.Value())
	if err != nil {
		return true, nil // unreadable: assume the worst
	}
	return m.State == attemptRunning, nil
}

func (a attempts) mark(ctx context.Context, key protocol.CallKey, state attemptState, attempt int, executor string) error {
	b, err := protocol.EncodeAttemptMark(&protocol.AttemptMark{State: state, Attempt: attempt, Executor: executor, At: time.Now().UTC()})
	if err != nil {
		return err
	}
	_, err = a.kv.Put(ctx, protocol.AttemptKey(key), b)
	return err
}
