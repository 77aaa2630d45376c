package exec

import (
	"errors"
	"time"

	"github.com/toolrelay/toolrelay/internal/backoff"
)

// ErrRetryable marks an error worth retrying: a transient failure the
// same call may not hit again (a timeout talking to a backend, a 503). Wrap
// it with [Retryable]. Errors not marked so fail the call at once.
var ErrRetryable = errors.New("exec: retryable")

// ErrRefused marks an expected refusal: the function worked as designed
// and declined the request (the order has already shipped, the customer
// does not exist). The model gets one failed result with the error's
// message, the call is not retried, and no dead letter is left: dead
// letters are for failures an operator must look at. Wrap it with
// [Refuse], or with %w in an error of your own. A refusal is never
// retried, even if it also wraps [ErrRetryable].
var ErrRefused = errors.New("exec: refused")

// ErrInvalidArguments marks arguments a handler cannot use although they
// passed the function's schema (or do not decode into a [TypedHandler]'s
// type). The model gets one invalid_arguments failure with the error's
// message; it is not retried and leaves no dead letter. Wrap it with
// [InvalidArguments], or with %w in an error of your own.
var ErrInvalidArguments = errors.New("exec: invalid arguments")

// ErrDidNotRun is returned by a Reconcile hook that established the
// earlier attempt had no effect: the call then runs normally.
var ErrDidNotRun = errors.New("exec: earlier attempt had no effect")

// ErrCallCancelled is the cause of a handler's context cancelled because
// its turn was cancelled: the platform cancelled or expired the run the
// call belongs to, or the MCP client that made the call gave up on it.
var ErrCallCancelled = errors.New("exec: the call's turn was cancelled")

// ErrNoDeadLetter is returned by [DeadLetters.Get] and [DeadLetters.Replay]
// when no dead letter has the key.
var ErrNoDeadLetter = errors.New("exec: no dead letter for that call")

// Retryable marks err as retryable. The call is retried with backoff while
// attempts remain and the deadline leaves room; the model sees err's
// message only if it never succeeds.
func Retryable(err error) error {
	if err == nil {
		return nil
	}
	return &retryableError{err}
}

type retryableError struct{ err error }

func (e *retryableError) Error() string        { return e.err.Error() }
func (e *retryableError) Unwrap() error        { return e.err }
func (e *retryableError) Is(target error) bool { return target == ErrRetryable }

// Refuse marks err as an expected refusal (see [ErrRefused]): the model
// reads err's message, and nothing is retried or dead-lettered.
func Refuse(err error) error {
	if err == nil {
		return nil
	}
	return &refusedError{err}
}

type refusedError struct{ err error }

func (e *refusedError) Error() string        { return e.err.Error() }
func (e *refusedError) Unwrap() error        { return e.err }
func (e *refusedError) Is(target error) bool { return target == ErrRefused }

// InvalidArguments marks err as a complaint about the arguments (see
// [ErrInvalidArguments]): the model reads err's message.
func InvalidArguments(err error) error {
	if err == nil {
		return nil
	}
	return &invalidArgumentsError{err}
}

type invalidArgumentsError struct{ err error }

func (e *invalidArgumentsError) Error() string        { return e.err.Error() }
func (e *invalidArgumentsError) Unwrap() error        { return e.err }
func (e *invalidArgumentsError) Is(target error) bool { return target == ErrInvalidArguments }

// RetryPolicy says how retryable errors are retried. Retries go back
// through JetStream, so another replica may take the next attempt.
type RetryPolicy struct {
	// MaxAttempts bounds the runs of one call, the first included.
	// Default: 3.
	MaxAttempts int
	// InitialBackoff is the delay before the second attempt; it doubles
	// with each attempt, with 20% jitter. Default: 200ms.
	InitialBackoff time.Duration
	// MaxBackoff caps the delay. Default: 10s.
	MaxBackoff time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = DefaultRetry.MaxAttempts
	}
	if p.InitialBackoff <= 0 {
		p.InitialBackoff = DefaultRetry.InitialBackoff
	}
	if p.MaxBackoff <= 0 {
		p.MaxBackoff = DefaultRetry.MaxBackoff
	}
	return p
}

// backoff is the delay before attempt+1.
func (p RetryPolicy) backoff(attempt int) time.Duration {
	return backoff.Backoff{Initial: p.InitialBackoff, Max: p.MaxBackoff}.Delay(attempt)
}

// ErrShutdown is the cause of a handler's context cancelled because the
// executor is shutting down; the call is redelivered to another replica.
var ErrShutdown = errors.New("exec: executor shutting down")

// ErrOwnedByOtherTeam is returned by Run when the dispatchers refuse a
// function because another team owns its name; the error names the owner.
var ErrOwnedByOtherTeam = errors.New("exec: function owned by another team")
