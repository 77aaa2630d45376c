package dispatch

import (
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Errors callers can test with errors.Is.
var (
	// ErrNotFound is wrapped by WatchStatus and Turn when there is no such
	// watch or turn (never made, or expired).
	ErrNotFound = errors.New("dispatch: not found")
	// ErrNotRunning is returned by Watch when the dispatcher is not running.
	ErrNotRunning = errors.New("dispatch: dispatcher is not running")
	// ErrNoWatchDriver is returned by Watch when no [WatchDriver] is
	// attached: the dispatcher drives no watches.
	ErrNoWatchDriver = errors.New("dispatch: no watch driver is attached (see package watch)")
	// ErrObjectNotFound is wrapped by the error Watch returns when the
	// platform answers that the object to watch does not exist (HTTP 404).
	// That error is a *FieldError naming the field of the request that
	// names the object.
	ErrObjectNotFound = errors.New("dispatch: the platform has no such object")
	// ErrUnavailable is wrapped by errors from operations that could not
	// reach JetStream for a while, for example while a server is lost and
	// its streams elect new leaders. Retrying later may succeed.
	ErrUnavailable = errors.New("dispatch: JetStream is unavailable")
)

// notFound turns a bucket's "no such key" into ErrNotFound naming what was
// looked up; other errors pass unchanged.
func notFound(what, id string, err error) error {
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrInvalidKey) {
		return fmt.Errorf("%w: %s %q", ErrNotFound, what, id)
	}
	return err
}

// FieldError is a validation error about one field of a request.
type FieldError struct {
	Field   string
	Message string
	// Err, when set, classifies the error (ErrObjectNotFound).
	Err error
}

func (e *FieldError) Error() string { return "dispatch: " + e.Message }

func (e *FieldError) Unwrap() error { return e.Err }

// PlatformError is an error the platform returned, classified for retry.
type PlatformError struct {
	Op         string
	StatusCode int
	// Retryable: 408, 409, 429, 5xx or a transport error (no answer).
	Retryable bool
	// RetryAfter is the delay the platform asked for, if any.
	RetryAfter time.Duration
	Err        error
}

func (e *PlatformError) Error() string {
	return fmt.Sprintf("dispatch: %s: %v", e.Op, e.Err)
}

func (e *PlatformError) Unwrap() error { return e.Err }
