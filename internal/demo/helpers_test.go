package demo

import (
	"encoding/json"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

func invocation(fn, args string) *exec.Invocation {
	return &exec.Invocation{Function: fn, Arguments: json.RawMessage(args)}
}
