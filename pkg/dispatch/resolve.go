package dispatch

import (
	"context"
	"fmt"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// resolve finds the team of a call and validates its arguments; it returns
// the failure the model should see, or nil.
func (d *Dispatcher) resolve(ctx context.Context, c *TurnCall) *protocol.CallError {
	if err := protocol.ValidateFunctionName(c.Name); err != nil {
		return &protocol.CallError{Code: protocol.CodeUnknownFunction,
			Message: fmt.Sprintf("There is no function named %q. Use one of the functions you were given.", c.Name)}
	}
	f, err := d.registry.lookup(ctx, c.Name)
	if err != nil {
		return &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s is unavailable right now. Try again later or continue without it.", c.Name)}
	}
	if f == nil {
		return &protocol.CallError{Code: protocol.CodeUnknownFunction,
			Message: fmt.Sprintf("There is no function named %q. Use one of the functions you were given.", c.Name)}
	}
	c.Team = f.team
	// Arguments are checked against what live executors declare; with none
	// alive there is nothing to run them, so wait a moment for one. A live
	// declaration is a lease its process renews, so it is also the answer
	// to "is anyone serving this?".
	if f = d.registry.awaitLive(ctx, f, d.opts.ServeGrace); len(f.live) == 0 {
		return notServed(c.Name)
	}
	if msg := f.validate(c.Arguments); msg != "" {
		return &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: msg}
	}
	// The team's result stream must exist before its executors can record
	// a result (it does once the team has declared, unless an operator
	// removed it since).
	if _, err := d.gather.streams.stream(ctx, c.Team); err != nil {
		d.log.Warn("cannot provision the team's result stream", "team", c.Team, "err", err)
		return &protocol.CallError{Code: protocol.CodeUnavailable,
			Message: fmt.Sprintf("%s is unavailable right now. Try again later or continue without it.", c.Name)}
	}
	return nil
}

// notServed is the failure of a call to a function no executor serves.
func notServed(name string) *protocol.CallError {
	return &protocol.CallError{Code: protocol.CodeUnavailable,
		Message: fmt.Sprintf("%s is unavailable: no executor is serving it right now. Continue without it, or try again later.", name)}
}
