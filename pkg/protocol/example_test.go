package protocol_test

import (
	"fmt"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The same required action gets the same keys on every replica and channel,
// whatever the order of its calls.
func ExampleNewTurnKey() {
	a := protocol.NewTurnKey(protocol.PlatformAssistants, "thread_1/run_1", []string{"call_a", "call_b"})
	b := protocol.NewTurnKey(protocol.PlatformAssistants, "thread_1/run_1", []string{"call_b", "call_a"})
	key := a.Call("call_a")
	fmt.Println(a == b, key.Turn() == a)
	fmt.Println(protocol.CallSubject("orders", "get_order_status"))
	fmt.Println(protocol.ValidateFunctionName("get.order") != nil)
	// Output:
	// true true
	// fncall.orders.get_order_status
	// true
}

// Platforms without a failure flag receive a failed call as a JSON error.
func ExampleResult_ModelOutput() {
	c := &protocol.Call{Key: protocol.NewTurnKey(protocol.PlatformResponses, "resp_1", []string{"call_1"}).Call("call_1"),
		CallID: "call_1", Team: "geo", Function: "get_weather"}
	res := protocol.NewFailure(c, protocol.CodeTimeout, "get_weather timed out after 9m30s.", c.Deadline)
	fmt.Println(res.ModelOutput())
	// Output:
	// {"error":{"type":"timeout","message":"get_weather timed out after 9m30s."}}
}
