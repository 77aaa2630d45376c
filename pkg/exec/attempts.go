package exec

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// For side-effect functions the executor records that an attempt started
// before running it, and what became of it after. A redelivered call whose
// last attempt is still marked running may have had its effect: it is
// reconciled, never blindly re-run.

type attemptState string

const (
	attemptRunning   attemptState = "running"
	attemptRetryable attemptState = "failed_retryable"
)

type attemptMark struct {
	State    attemptState `json:"state"`
	Attempt  int          `json:"attempt"`
	Executor string       `json:"executor"`
	At       time.Time    `json:"at"`
}

type attempts struct{ kv jetstream.KeyValue }

func attemptKey(k protocol.CallKey) string { return string(k) }

// mayHaveRun reports whether an earlier attempt of the call started and
// did not end in a known state.
func (a attempts) mayHaveRun(ctx context.Context, key protocol.CallKey) (bool, error) {
	e, err := a.kv.Get(ctx, attemptKey(key))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	var m attemptMark
	if json.Unmarshal(e.Value(), &m) != nil {
		return true, nil // unreadable: assume the worst
	}
	return m.State == attemptRunning, nil
}

func (a attempts) mark(ctx context.Context, key protocol.CallKey, state attemptState, attempt int, executor string) error {
	b, _ := json.Marshal(attemptMark{State: state, Attempt: attempt, Executor: executor, At: time.Now().UTC()})
	_, err := a.kv.Put(ctx, attemptKey(key), b)
	return err
}
