package demo

import (
	"encoding/json"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func invocation(fn, args string) *exec.Invocation {
	return &exec.Invocation{Call: &protocol.Call{Function: fn, Arguments: json.RawMessage(args)}, Attempt: 1}
}

// textInvocation is a call of a custom tool with the model's text.
func textInvocation(fn, input string) *exec.Invocation {
	args, _ := json.Marshal(input)
	return &exec.Invocation{Call: &protocol.Call{Function: fn, Arguments: args, Format: protocol.FormatText}, Attempt: 1}
}
