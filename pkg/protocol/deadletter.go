package protocol

import (
	"fmt"
	"strconv"
	"time"
)

// Dead letters: calls that failed for good (a permanent error, a panic,
// exhausted attempts, an attempt that may have run), kept for operators to
// list and replay.
const (
	DeadLetterSubjectPrefix = "fndlq"
	DeadLetterStream        = "FNDLQ"
	// AttemptBucket records, for side-effect functions, that an attempt
	// started, so a redelivery knows the call may have run.
	AttemptBucket = "toolrelay_attempts"
	// HeaderReplay marks a call an operator replayed from the dead
	// letters; its value is the replay number, from 1.
	HeaderReplay = "Toolrelay-Replay"
)

// Reasons a call became a dead letter.
const (
	ReasonPermanent   = "permanent_error"
	ReasonPanic       = "panic"
	ReasonExhausted   = "attempts_exhausted"
	ReasonMayHaveRun  = "may_have_run"
	ReasonReplayed    = "replayed"
	ReasonUndelivered = "undeliverable"
)

// DeadLetterSubject is the prefix of the subjects of a function's dead
// letters (see DeadLetterCallSubject), and the subject where records
// written before per-call subjects are kept.
func DeadLetterSubject(team, function string) string {
	return DeadLetterSubjectPrefix + "." + team + "." + function
}

// DeadLetterCallSubject is where the records of one call are kept, its
// dead letter and its replays' outcomes:
// fndlq.<team>.<function>.<turn>.<call> (the call key is two tokens). One
// subject per call lets a reader find a call's records by a direct get on
// its subject, and count dead letters per call from the stream's subjects.
func DeadLetterCallSubject(team, function string, key CallKey) string {
	return DeadLetterSubject(team, function) + "." + string(key)
}

// DeadLetter is the record of a call that failed for good, or (Replay > 0)
// the outcome of an operator's replay of one.
type DeadLetter struct {
	Version  int       `json:"v"`
	Call     *Call     `json:"call"`
	Result   *Result   `json:"result"`
	Reason   string    `json:"reason"`
	Attempts int       `json:"attempts"`
	Executor string    `json:"executor,omitempty"`
	At       time.Time `json:"at"`
	Replay   int       `json:"replay,omitempty"`
}

// MsgID is the record's message ID: one dead letter per call, and one
// record per replay of it.
func (d *DeadLetter) MsgID() string {
	if d.Replay > 0 {
		return "dlq." + string(d.Call.Key) + ".r" + strconv.Itoa(d.Replay)
	}
	return "dlq." + string(d.Call.Key)
}

// Validate reports whether d is complete.
func (d *DeadLetter) Validate() error {
	if d.Version < 1 || d.Version > Version {
		return fmt.Errorf("%w: dead letter version %d not supported", ErrMalformed, d.Version)
	}
	if d.Call == nil || d.Result == nil || d.Reason == "" || d.At.IsZero() {
		return fmt.Errorf("%w: dead letter needs call, result, reason and at", ErrMalformed)
	}
	if err := d.Call.Validate(); err != nil {
		return err
	}
	if err := d.Result.Validate(); err != nil {
		return err
	}
	if d.Result.Key != d.Call.Key {
		return fmt.Errorf("%w: dead letter result %s is not for call %s", ErrMalformed, d.Result.Key, d.Call.Key)
	}
	return nil
}

// EncodeDeadLetter validates and encodes d.
func EncodeDeadLetter(d *DeadLetter) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return marshal(d)
}

// DecodeDeadLetter decodes and validates a dead letter.
func DecodeDeadLetter(data []byte) (*DeadLetter, error) {
	var d DeadLetter
	if err := decodeStrictJSON(data, &d); err != nil {
		return nil, fmt.Errorf("%w: dead letter: %w", ErrMalformed, err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}
