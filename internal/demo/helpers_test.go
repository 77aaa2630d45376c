package demo

import (
	"encoding/json"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func invocation(fn, args string) *exec.Invocation {
	return &exec.Invocation{Call: &protocol.Call{Function: fn, Arguments: json.RawMessage(args)}, Attempt: 1}
}
