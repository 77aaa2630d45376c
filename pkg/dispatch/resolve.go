package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// resolve finds the team of a call and validates its arguments; it returns
// the failure the model should see, or nil. A function no live executor
// serves is waited for up to grace (longer if one served it a moment ago).
// With no failure it returns the digest of the schema the arguments match
// (see protocol.HeaderSchema), and the call's hold if its function's
// approval policy holds it (approvals.go).
func (d *Dispatcher) resolve(ctx context.Context, c *TurnCall, grace time.Duration) (checked string, h *hold, cerr *protocol.CallError) {
	if err := protocol.ValidateFunctionName(c.Name); err != nil {
		return "", nil, &protocol.CallError{Code: protocol.CodeUnknownFunction,
			Message: fmt.Sprintf("There is no function named %q. Use one of the functions you were given.", c.Name)}
	}
	f, err := d.registry.lookup(ctx, c.Name)
	if err != nil {
		return "", nil, &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s is unavailable right now. Try again later or continue without it.", c.Name)}
	}
	if f == nil {
		return "", nil, &protocol.CallError{Code: protocol.CodeUnknownFunction,
			Message: fmt.Sprintf("There is no function named %q. Use one of the functions you were given.", c.Name)}
	}
	c.Team = f.team
	// Arguments are checked against what live executors declare; with none
	// alive there is nothing to run them, so wait a moment for one. A live
	// declaration is a lease its process renews, so it is also the answer
	// to "is anyone serving this?". One whose lease lapsed a moment ago,
	// unrenewed, is waited for as long as JetStream is when it is away:
	// the renewals of a live process are held back while a server fails
	// over, and calling it unserved then would fail calls it can run.
	if len(f.live) == 0 && grace > 0 && d.registry.lapsedLately(f.name, f.team) {
		grace = max(grace, d.unavailableFor)
	}
	if f = d.registry.awaitLive(ctx, f, grace); len(f.live) == 0 {
		return "", nil, notServed(c.Name)
	}
	if text := f.live[0].decl.Spec.Format != nil; text != c.Custom {
		msg := fmt.Sprintf("%s is a custom tool: it takes free-form text, and is called as a custom tool, not as a function with JSON arguments.", c.Name)
		if !text {
			msg = fmt.Sprintf("%s is a function: call it with JSON arguments that match its parameters, not as a custom tool with text.", c.Name)
		}
		return "", nil, &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: msg}
	}
	checked, problem := f.validate(c.Arguments)
	if problem != "" {
		return "", nil, &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: problem}
	}
	c.SideEffects = f.live[0].decl.Spec.SideEffects
	h = d.holdOf(c, f.live[0])
	// The team's result stream must exist before its executors can record
	// a result (it does once the team has declared, unless an operator
	// removed it since).
	if _, err := d.gather.streams.stream(ctx, c.Team); err != nil {
		d.log.Warn("cannot provision the team's result stream", "team", c.Team, "err", err)
		return "", nil, &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s is unavailable right now. Try again later or continue without it.", c.Name)}
	}
	if h != nil {
		c.Approval = true
	}
	return checked, h, nil
}

// notServed is the failure of a call to a function no executor serves.
func notServed(name string) *protocol.CallError {
	return &protocol.CallError{Code: protocol.CodeUnavailable,
		Message: fmt.Sprintf("%s is unavailable: no executor is serving it right now. Continue without it, or try again later.", name)}
}

// failRejected records the failure of each call of t rejected at intake
// whose result is missing: an intake cut short (a shutdown, a crash, a lost
// connection) between recording the turn and recording those failures
// would otherwise leave the turn to its deadline, and the model would read
// "timed out" for a call that never ran. The reason is found again without
// waiting for executors; a call that would pass now still failed at intake,
// where nothing served it.
func (d *Dispatcher) failRejected(ctx context.Context, t *Turn, recorded map[protocol.CallKey]bool) {
	for i := range t.Calls {
		c := &t.Calls[i]
		if !c.Rejected || recorded[c.Key] {
			continue
		}
		probe := *c
		_, _, cerr := d.resolve(ctx, &probe, 0)
		if cerr == nil {
			cerr = notServed(c.Name)
		}
		d.recordFailure(ctx, t, c, cerr)
	}
}
