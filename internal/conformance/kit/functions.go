package kit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

// The test functions an executor serves for the kit. Their behaviour is
// the kit's definition (docs/operations.md, "Conformance kit", describes
// it for teams); their names all start with "conformance_".
const (
	// FnEcho: arguments {"text": string}, the schema EchoSchema. Output:
	// the text, as is. EchoSchema's maxLength of 8 is there for the digest
	// case: a call whose Toolrelay-Schema header is the digest of the
	// schema the executor declared is not checked again, so a longer text
	// comes back; without the header it fails as invalid_arguments.
	FnEcho = "conformance_echo"
	// FnFail: arguments {"mode": "error"|"refuse"}. "error" fails the call
	// for good with a non-retryable error ("conformance_fail failed as
	// asked"): a function_error result and a permanent_error dead letter.
	// "refuse" is an expected refusal ("conformance_fail refused as
	// asked"): a function_error result, no dead letter.
	FnFail = "conformance_fail"
	// FnRetry: arguments {"fail_times": n}. An attempt numbered n or below
	// (the delivery count, from 1) fails retryably; a later one returns
	// "attempt <n>".
	FnRetry = "conformance_retry"
	// FnSlow: arguments {"ms": n}; declared with a timeout of SlowTimeout.
	// It waits n milliseconds, or until its deadline or a cancellation
	// stops it, and returns "slept <n>ms".
	FnSlow = "conformance_slow"
	// FnEffect: a side-effect function (side_effects: true, no reconcile
	// hook, or one that cannot tell). Arguments {"text": string}; output:
	// the text.
	FnEffect = "conformance_effect"
)

// SlowTimeout is the timeout FnSlow declares: one run may last that long.
const SlowTimeout = 2 * time.Second

// EchoSchema is FnEcho's parameter schema, to be declared with these
// bytes or any others that mean the same JSON: its description has
// non-ASCII, "<", ">" and "&", and its examples numbers in several forms,
// all of which the schema digest must get right.
const EchoSchema = `{"type": "object", "description": "Text to echo: Größe <b> & \"so\"", ` +
	`"properties": {"text": {"type": "string", "maxLength": 8}}, "required": ["text"], ` +
	`"additionalProperties": false, "examples": [{"text": "°C"}], "$comment": "1.50 -0 1e-2", "x-numbers": [1.50, -0, 1e-2, 20]}`

// Functions lists the test functions, in the order the kit uses them.
var Functions = []string{FnEcho, FnFail, FnRetry, FnSlow, FnEffect}

// Messages of FnFail, as the model reads them.
const (
	FailMessage   = "conformance_fail failed as asked"
	RefuseMessage = "conformance_fail refused as asked"
)

// GoFunctions returns the test functions on pkg/exec, for the kit's own
// test and as the reference for teams in other languages.
func GoFunctions() []exec.Function {
	text := func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
		var a struct {
			Text string `json:"text"`
		}
		if err := json.Unmarshal(inv.Call.Arguments, &a); err != nil {
			return nil, exec.InvalidArguments(err)
		}
		return []byte(a.Text), nil
	}
	return []exec.Function{
		{Name: FnEcho, Description: "Echo the text.", Parameters: json.RawMessage(EchoSchema), Handler: exec.HandlerFunc(text)},
		{
			Name: FnFail, Description: "Fail as asked.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"mode":{"enum":["error","refuse"]}},"required":["mode"]}`),
			Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
				var a struct {
					Mode string `json:"mode"`
				}
				_ = json.Unmarshal(inv.Call.Arguments, &a)
				if a.Mode == "refuse" {
					return nil, exec.Refuse(errors.New(RefuseMessage))
				}
				return nil, errors.New(FailMessage)
			}),
		},
		{
			Name: FnRetry, Description: "Fail retryably a number of times, then succeed.",
			Parameters: json.RawMessage(`{"type":"object","properties":{"fail_times":{"type":"integer","minimum":0}},"required":["fail_times"]}`),
			Retry:      &exec.RetryPolicy{InitialBackoff: 50 * time.Millisecond, MaxBackoff: 200 * time.Millisecond},
			Handler: exec.HandlerFunc(func(_ context.Context, inv *exec.Invocation) ([]byte, error) {
				var a struct {
					FailTimes int `json:"fail_times"`
				}
				_ = json.Unmarshal(inv.Call.Arguments, &a)
				if inv.Attempt <= a.FailTimes {
					return nil, exec.Retryable(fmt.Errorf("conformance_retry failed attempt %d as asked", inv.Attempt))
				}
				return fmt.Appendf(nil, "attempt %d", inv.Attempt), nil
			}),
		},
		{
			Name: FnSlow, Description: "Wait a while.", Timeout: SlowTimeout,
			Parameters: json.RawMessage(`{"type":"object","properties":{"ms":{"type":"integer","minimum":0}},"required":["ms"]}`),
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				var a struct {
					MS int `json:"ms"`
				}
				_ = json.Unmarshal(inv.Call.Arguments, &a)
				t := time.NewTimer(time.Duration(a.MS) * time.Millisecond)
				defer t.Stop()
				select {
				case <-t.C:
					return fmt.Appendf(nil, "slept %dms", a.MS), nil
				case <-ctx.Done():
					return nil, context.Cause(ctx)
				}
			}),
		},
		{
			Name: FnEffect, Description: "Echo the text, as a side effect.", SideEffects: true,
			Parameters: json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"]}`),
			Handler:    exec.HandlerFunc(text),
		},
	}
}
