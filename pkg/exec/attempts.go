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
// did not end in a known state. rev is the mark's revision (0: none), for
// start.
func (a attempts) mayHaveRun(ctx context.Context, key protocol.CallKey) (may bool, rev uint64, err error) {
	e, err := a.kv.Get(ctx, protocol.AttemptKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, 0, nil
	}
	if err != nil {
		return false, 0, err
	}
	m, err := protocol.DecodeAttemptMark(e.Value())
	if err != nil {
		return true, e.Revision(), nil // unreadable: assume the worst
	}
	return m.State == attemptRunning, e.Revision(), nil
}

// errAttemptRaced: another attempt of the call marked itself running
// between this one's check and its mark.
var errAttemptRaced = errors.New("exec: another attempt of this call started meanwhile")

// start marks an attempt running, by compare-and-set on the mark mayHaveRun
// read at rev: of two attempts that both found no attempt running (one
// stalled past its ack wait between the check and the mark, the other got
// the redelivery), only one may run. The loser gets errAttemptRaced.
func (a attempts) start(ctx context.Context, key protocol.CallKey, rev uint64, attempt int, executor string) error {
	b, err := encodeMark(attemptRunning, attempt, executor)
	if err != nil {
		return err
	}
	if rev == 0 {
		_, err = a.kv.Create(ctx, protocol.AttemptKey(key), b)
	} else {
		_, err = a.kv.Update(ctx, protocol.AttemptKey(key), b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return errAttemptRaced
	}
	return err
}

// mark records what became of this process's own attempt.
func (a attempts) mark(ctx context.Context, key protocol.CallKey, state attemptState, attempt int, executor string) error {
	b, err := encodeMark(state, attempt, executor)
	if err != nil {
		return err
	}
	_, err = a.kv.Put(ctx, protocol.AttemptKey(key), b)
	return err
}

func encodeMark(state attemptState, attempt int, executor string) ([]byte, error) {
	return protocol.EncodeAttemptMark(&protocol.AttemptMark{State: state, Attempt: attempt, Executor: executor, At: time.Now().UTC()})
}
