package protocol

import (
	"errors"
	"fmt"
)

// ErrInvalidName is wrapped by every error about a function or team name.
var ErrInvalidName = errors.New("protocol: invalid name")

// ErrMalformed is wrapped by every decoding and validation error.
var ErrMalformed = errors.New("protocol: malformed envelope")

// ErrorCode classifies a failed call. The list is append-only: codes are
// stored in results and read by other processes and by the model.
type ErrorCode string

// Error codes of failed calls.
const (
	// CodeTimeout: the call did not finish before its deadline.
	CodeTimeout ErrorCode = "timeout"
	// CodeInvalidArguments: the arguments are not JSON, break the schema, or are too large.
	CodeInvalidArguments ErrorCode = "invalid_arguments"
	// CodeUnknownFunction: no function of that name is registered.
	CodeUnknownFunction ErrorCode = "unknown_function"
	// CodeUnavailable: the function exists but nothing serves it, or it may
	// have run and could not be retried safely.
	CodeUnavailable ErrorCode = "unavailable"
	// CodeFunctionError: the function ran and failed.
	CodeFunctionError ErrorCode = "function_error"
	// CodeDenied: the call needed a person's approval and was denied, or
	// not approved in time; it did not run.
	CodeDenied ErrorCode = "denied"
)

// Validate reports whether c is a known code.
func (c ErrorCode) Validate() error {
	switch c {
	case CodeTimeout, CodeInvalidArguments, CodeUnknownFunction, CodeUnavailable, CodeFunctionError, CodeDenied:
		return nil
	}
	return fmt.Errorf("protocol: unknown error code %q", string(c))
}

// CallError is why a call failed, written for the model: what failed and
// what it can do differently.
type CallError struct {
	Code    ErrorCode `json:"type"`
	Message string    `json:"message"`
}

func (e *CallError) Error() string { return string(e.Code) + ": " + e.Message }
