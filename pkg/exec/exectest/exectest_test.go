package exectest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/exec/exectest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestRunAppliesTheExecutorsRules(t *testing.T) {
	fn := exec.Function{
		Name:       "greet",
		Parameters: []byte(`{"type":"object","properties":{"name":{"type":"string"}},"required":["name"]}`),
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			if got, ok := exec.InvocationFromContext(ctx); !ok || got != inv || inv.Call.CallID != "call_test" {
				return nil, errors.New("no call ID in context")
			}
			if strings.Contains(string(inv.Call.Arguments), "boom") {
				panic("boom")
			}
			if strings.Contains(string(inv.Call.Arguments), "slow") {
				<-ctx.Done()
				return nil, ctx.Err()
			}
			return []byte("hello"), nil
		}),
	}
	if res := exectest.Run(t, fn, `{"name":"x"}`, exectest.Options{}); !res.OK() || res.Output != "hello" {
		t.Errorf("ok call: %+v", res)
	}
	if res := exectest.Run(t, fn, `{}`, exectest.Options{}); res.OK() || res.Error.Code != protocol.CodeInvalidArguments {
		t.Errorf("bad arguments: %+v", res)
	}
	if res := exectest.Run(t, fn, `{"name":"boom"}`, exectest.Options{}); res.OK() || strings.Contains(res.Error.Message, "boom") {
		t.Errorf("panic: %+v", res)
	}
	if res := exectest.Run(t, fn, `{"name":"slow"}`, exectest.Options{Deadline: 50 * time.Millisecond}); res.OK() || res.Error.Code != protocol.CodeTimeout {
		t.Errorf("deadline: %+v", res)
	}
}

func ExampleCall() {
	fn := exec.Function{
		Name: "get_city",
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			return []byte("Seattle, WA"), nil
		}),
	}
	res, _ := exec.Invoke(context.Background(), fn, exectest.Call(fn, `{}`, exectest.Options{}))
	fmt.Println(res.Output)
	// Output: Seattle, WA
}
