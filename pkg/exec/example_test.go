package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/exec/exectest"
)

// A function is a name, a JSON Schema and a handler. Errors are written for
// the model; a transient one is marked retryable.
func ExampleFunction() {
	getOrder := exec.Function{
		Name:        "get_order_status",
		Description: "Look up the fulfilment status of an order.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string"}},"required":["order_id"]}`),
		Timeout:     10 * time.Second,
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			var args struct {
				OrderID string `json:"order_id"`
			}
			if err := json.Unmarshal(inv.Call.Arguments, &args); err != nil {
				return nil, err
			}
			switch args.OrderID {
			case "A-1001":
				return []byte(`{"status":"shipped"}`), nil
			case "A-503":
				return nil, exec.Retryable(errors.New("the order service is busy"))
			}
			return nil, fmt.Errorf("no order %q; ask the user to check the order number", args.OrderID)
		}),
	}
	// Call the handler directly; package exectest runs it as an executor
	// would (schema, deadline, retries) in a test.
	for _, args := range []string{`{"order_id":"A-1001"}`, `{"order_id":"B-7"}`} {
		inv := &exec.Invocation{Call: exectest.Call(getOrder, args, exectest.Options{}), Attempt: 1}
		if out, err := getOrder.Handler.Handle(context.Background(), inv); err != nil {
			fmt.Println("error:", err)
		} else {
			fmt.Println("ok:", string(out))
		}
	}
	// Output:
	// ok: {"status":"shipped"}
	// error: no order "B-7"; ask the user to check the order number
}
