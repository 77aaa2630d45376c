package protocol

import (
	"fmt"
	"time"
)

// Attempt marks: before running a side-effect function, an executor records
// in the AttemptBucket, under AttemptKey, that an attempt started; a
// retryable failure overwrites the mark. A redelivered call whose mark
// still says running may have had its effect, so it is reconciled or
// failed, never blindly run again.

// AttemptState is the state an attempt mark records.
type AttemptState string

// Attempt states.
const (
	// AttemptRunning: an attempt started and has not ended in a known
	// state; the effect may have happened.
	AttemptRunning AttemptState = "running"
	// AttemptRetryable: the last attempt ended in a retryable error
	// (the function reported that it may be tried again); the next
	// attempt runs.
	AttemptRetryable AttemptState = "failed_retryable"
)

// AttemptMark is the value of an attempt mark.
type AttemptMark struct {
	State    AttemptState `json:"state"`
	Attempt  int          `json:"attempt"`
	Executor string       `json:"executor"`
	At       time.Time    `json:"at"`
}

// AttemptKey is the key of a call's attempt mark: the call key.
func AttemptKey(key CallKey) string { return string(key) }

// EncodeAttemptMark encodes m.
func EncodeAttemptMark(m *AttemptMark) ([]byte, error) { return marshal(m) }

// DecodeAttemptMark decodes an attempt mark. A mark that cannot be read
// must be taken as AttemptRunning: assume the worst.
func DecodeAttemptMark(data []byte) (*AttemptMark, error) {
	var m AttemptMark
	if err := decodeStrictJSON(data, &m); err != nil {
		return nil, fmt.Errorf("%w: attempt mark: %w", ErrMalformed, err)
	}
	return &m, nil
}
