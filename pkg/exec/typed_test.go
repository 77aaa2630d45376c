package exec_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/exec/exectest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

type orderArgs struct {
	OrderID  string   `json:"order_id" jsonschema:"the order number, e.g. A-1001"`
	Quantity int      `json:"quantity,omitempty"`
	Gift     *bool    `json:"gift,omitempty"`
	Tags     []string `json:"tags,omitzero"`
}

type orderStatus struct {
	OrderID string `json:"order_id"`
	Status  string `json:"status"`
	Items   int    `json:"items"`
}

func getOrder(ran *atomic.Int32) exec.Function {
	return exec.Function{Name: "get_order", Handler: exec.TypedHandler(
		func(ctx context.Context, inv *exec.Invocation, in orderArgs) (orderStatus, error) {
			ran.Add(1)
			if in.OrderID == "B-7" {
				return orderStatus{}, errors.New("no order B-7; ask the user to check the order number")
			}
			return orderStatus{OrderID: in.OrderID, Status: "shipped", Items: in.Quantity}, nil
		})}
}

func TestSchemaForDerivesTheArgumentsSchema(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  func() (json.RawMessage, error)
		want string // "" when an error is wanted
	}{
		{name: "struct", got: exec.SchemaFor[orderArgs], want: `{"type":"object",
			"properties":{
				"order_id":{"type":"string","description":"the order number, e.g. A-1001"},
				"quantity":{"type":"integer"},
				"gift":{"type":["null","boolean"]},
				"tags":{"type":["null","array"],"items":{"type":"string"}}},
			"required":["order_id"],"additionalProperties":false}`},
		{name: "no arguments", got: exec.SchemaFor[struct{}], want: `{"type":"object","additionalProperties":false}`},
		{name: "map", got: exec.SchemaFor[map[string]int], want: `{"type":"object","additionalProperties":{"type":"integer"}}`},
		{name: "not an object", got: exec.SchemaFor[string]},
		{name: "not representable", got: exec.SchemaFor[struct{ F func() }]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.got()
			if tc.want == "" {
				if err == nil || !strings.HasPrefix(err.Error(), "exec: schema of ") {
					t.Fatalf("SchemaFor = %s, %v; want an exec: error", got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var g, w any
			if err := json.Unmarshal(got, &g); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal([]byte(tc.want), &w); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(w, g); diff != "" {
				t.Errorf("schema (-want +got):\n%s", diff)
			}
		})
	}
}

// Through a real executor: the derived schema is what the registry shows
// and what the executor checks; arguments are decoded, the output encoded.
func TestTypedHandlerThroughAnExecutor(t *testing.T) {
	var ran atomic.Int32
	h := start(t, "team-a", exec.Options{}, getOrder(&ran))

	res := h.result(h.call("team-a", "get_order", `{"order_id":"A-1001","quantity":2}`, time.Now().Add(time.Minute)), 10*time.Second)
	if !res.OK() || res.Output != `{"order_id":"A-1001","status":"shipped","items":2}` {
		t.Fatalf("result = %+v", res)
	}
	res = h.result(h.call("team-a", "get_order", `{"order_id":"B-7"}`, time.Now().Add(time.Minute)), 10*time.Second)
	if res.OK() || res.Error.Code != protocol.CodeFunctionError || !strings.HasPrefix(res.Error.Message, "no order B-7") {
		t.Fatalf("handler error: %+v", res)
	}
	// The derived schema refuses what orderArgs cannot hold, before the handler runs.
	before := ran.Load()
	for _, args := range []string{`{}`, `{"order_id":7}`, `{"order_id":"A-1","color":"red"}`, `{"order_id":"A-1","quantity":1.5}`} {
		res := h.result(h.call("team-a", "get_order", args, time.Now().Add(time.Minute)), 10*time.Second)
		if res.OK() || res.Error.Code != protocol.CodeInvalidArguments {
			t.Errorf("%s: result = %+v, want invalid_arguments", args, res)
		}
	}
	if ran.Load() != before {
		t.Errorf("handler ran for arguments the schema refuses")
	}
	want, _ := exec.SchemaFor[orderArgs]()
	declared := h.declared("team-a", "get_order")
	if len(declared) != 1 || string(declared[0].Spec.Parameters) != string(want) {
		t.Errorf("declared %+v, want one declaration with parameters %s", declared, want)
	}
}

// With hand-written Parameters looser than In, arguments that pass the
// schema but do not decode fail as invalid_arguments, without a retry or a
// dead letter, and the handler does not run.
func TestTypedHandlerRefusesArgumentsThatDoNotDecode(t *testing.T) {
	var ran atomic.Int32
	fn := getOrder(&ran)
	fn.Parameters = json.RawMessage(`{"type":"object"}`)
	res := exectest.Run(t, fn, `{"order_id":"A-1","quantity":"two"}`, exectest.Options{})
	if res.OK() || res.Error.Code != protocol.CodeInvalidArguments || res.Verdict != exectest.Recorded ||
		!errors.Is(res.Err, exec.ErrInvalidArguments) || !strings.HasPrefix(res.Error.Message, "the arguments do not fit get_order: ") {
		t.Fatalf("result = %+v, verdict %s, err %v", res.Result, res.Verdict, res.Err)
	}
	if ran.Load() != 0 {
		t.Error("handler ran")
	}
	if res := exectest.Run(t, fn, `{"order_id":"A-1"}`, exectest.Options{}); !res.OK() || res.Output != `{"order_id":"A-1","status":"shipped","items":0}` {
		t.Errorf("good arguments: %+v", res.Result)
	}
}

func TestTypedHandlerNeedsAnObjectType(t *testing.T) {
	e, err := exec.New(nil, "team-a", exec.Options{})
	if err != nil {
		t.Fatal(err)
	}
	fn := exec.Function{Name: "bad", Handler: exec.TypedHandler(func(context.Context, *exec.Invocation, []string) (string, error) { return "", nil })}
	if err := e.Register(fn); err == nil || !strings.Contains(err.Error(), "struct or a map") {
		t.Errorf("Register = %v, want an error about the arguments type", err)
	}
	fn.Parameters = json.RawMessage(`{"type":"object"}`) // hand-written: the type is the author's business
	if err := e.Register(fn); err != nil {
		t.Errorf("Register with explicit parameters = %v", err)
	}
}
