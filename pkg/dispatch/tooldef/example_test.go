package tooldef_test

import (
	"encoding/json"
	"fmt"

	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// What executors announce becomes the tool definitions an agent is
// configured with.
func ExampleDefinitions() {
	specs := []*protocol.FunctionSpec{{
		Name: "get_weather", Description: "Current weather.",
		Parameters: json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"}},"required":["location"],"additionalProperties":false}`),
	}}
	defs, _ := tooldef.Definitions(specs, protocol.PlatformResponses)
	fmt.Println(string(defs[0]))
	// Output:
	// {"description":"Current weather.","name":"get_weather","parameters":{"type":"object","properties":{"location":{"type":"string"}},"required":["location"],"additionalProperties":false},"strict":true,"type":"function"}
}
