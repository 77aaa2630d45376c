package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Functions lists the functions executors announced, by name.
func Functions(ctx context.Context, js jetstream.JetStream) ([]*protocol.FunctionSpec, error) {
	kv, err := js.KeyValue(ctx, protocol.RegistryBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry: %w", err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry: %w", err)
	}
	var specs []*protocol.FunctionSpec
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		s, err := protocol.DecodeFunctionSpec(e.Value())
		if err != nil {
			continue
		}
		specs = append(specs, s)
	}
	slices.SortFunc(specs, func(a, b *protocol.FunctionSpec) int { return strings.Compare(a.Name, b.Name) })
	return specs, nil
}

// ToolDefinitions renders functions as the tool definitions a platform's
// agent configuration takes: Agents function tools, Assistants functions,
// or Responses functions. "strict" (Assistants, Responses) is set when the
// schema meets strict mode's rules: every object closed with
// additionalProperties false and every property required.
func ToolDefinitions(specs []*protocol.FunctionSpec, p protocol.Platform) ([]json.RawMessage, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	out := make([]json.RawMessage, 0, len(specs))
	for _, s := range specs {
		var schema map[string]any
		if err := json.Unmarshal(s.Parameters, &schema); err != nil {
			return nil, fmt.Errorf("dispatch: schema of %s: %w", s.Name, err)
		}
		strict := strictCompatible(schema)
		var def any
		switch p {
		case protocol.PlatformAgents:
			def = map[string]any{"type": "function", "name": s.Name, "description": s.Description, "parameters": s.Parameters}
		case protocol.PlatformAssistants:
			def = map[string]any{"type": "function", "function": map[string]any{
				"name": s.Name, "description": s.Description, "parameters": s.Parameters, "strict": strict}}
		case protocol.PlatformResponses:
			def = map[string]any{"type": "function", "name": s.Name, "description": s.Description, "parameters": s.Parameters, "strict": strict}
		}
		b, err := json.Marshal(def)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	return out, nil
}

// strictCompatible reports whether a schema meets the platforms' strict
// mode: each object lists every property as required and forbids others.
func strictCompatible(schema map[string]any) bool {
	if t, _ := schema["type"].(string); t == "object" || schema["properties"] != nil {
		if ap, ok := schema["additionalProperties"].(bool); !ok || ap {
			return false
		}
		props, _ := schema["properties"].(map[string]any)
		required := map[string]bool{}
		if req, ok := schema["required"].([]any); ok {
			for _, r := range req {
				if s, ok := r.(string); ok {
					required[s] = true
				}
			}
		}
		for name, sub := range props {
			if !required[name] {
				return false
			}
			if m, ok := sub.(map[string]any); ok && !strictCompatible(m) {
				return false
			}
		}
	}
	if items, ok := schema["items"].(map[string]any); ok && !strictCompatible(items) {
		return false
	}
	for _, key := range []string{"anyOf", "oneOf", "allOf"} {
		if list, ok := schema[key].([]any); ok {
			for _, sub := range list {
				if m, ok := sub.(map[string]any); ok && !strictCompatible(m) {
					return false
				}
			}
		}
	}
	return true
}
