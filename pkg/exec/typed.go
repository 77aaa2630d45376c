package exec

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/google/jsonschema-go/jsonschema"
)

// TypedHandler adapts a function of Go values to a [Handler]: the call's
// arguments are decoded into In with encoding/json, f runs, and what it
// returns is encoded as the output with encoding/json (a string output
// becomes a JSON string; return []byte from a [HandlerFunc] for raw
// output). Arguments that do not decode into In fail the call as
// invalid_arguments ([ErrInvalidArguments]) without running f.
//
// A [Function] whose Handler is a TypedHandler and whose Parameters are
// empty gets Parameters derived from In by [SchemaFor], so the schema the
// dispatcher checks and the type the handler decodes cannot disagree.
//
//	type orderArgs struct {
//		OrderID string `json:"order_id" jsonschema:"the order number, e.g. A-1001"`
//	}
//	exec.Function{Name: "get_order_status", Handler: exec.TypedHandler(
//		func(ctx context.Context, inv *exec.Invocation, in orderArgs) (Status, error) { ... })}
func TypedHandler[In, Out any](f func(ctx context.Context, inv *Invocation, in In) (Out, error)) Handler {
	return typedHandler[In, Out](f)
}

type typedHandler[In, Out any] func(ctx context.Context, inv *Invocation, in In) (Out, error)

func (h typedHandler[In, Out]) Handle(ctx context.Context, inv *Invocation) ([]byte, error) {
	var in In
	if len(inv.Call.Arguments) > 0 {
		if err := json.Unmarshal(inv.Call.Arguments, &in); err != nil {
			return nil, InvalidArguments(fmt.Errorf("the arguments do not fit %s: %v", inv.Call.Function, err))
		}
	}
	out, err := h(ctx, inv, in)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(out)
	if err != nil {
		// A bug in the function, not something the model can fix.
		return nil, fmt.Errorf("%s failed: its output cannot be encoded as JSON: %v", inv.Call.Function, err)
	}
	return b, nil
}

// parameters is the schema Function.validate derives for an empty
// Parameters.
func (typedHandler[In, Out]) parameters() (json.RawMessage, error) { return SchemaFor[In]() }

// SchemaFor derives the JSON Schema of T's JSON encoding with
// github.com/google/jsonschema-go: a struct is an object whose exported
// fields are its properties (named by their json tags), required unless
// tagged omitempty or omitzero, with no other properties allowed; a
// `jsonschema:"..."` tag is the property's description, which the model
// reads. T must encode as a JSON object (a struct or a map with string
// keys), as function arguments are one. For enums, patterns or bounds,
// write Function.Parameters by hand (it may start from this output).
func SchemaFor[T any]() (json.RawMessage, error) {
	t := reflect.TypeFor[T]()
	s, err := jsonschema.For[T](nil)
	if err != nil {
		return nil, fmt.Errorf("exec: schema of %s: %w", t, err)
	}
	if s.Type != "object" {
		return nil, fmt.Errorf("exec: schema of %s: arguments are a JSON object, so the type must be a struct or a map with string keys", t)
	}
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("exec: schema of %s: %w", t, err)
	}
	return b, nil
}
