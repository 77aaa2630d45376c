package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// FunctionStatus is a function as the fleet serves it now.
type FunctionStatus struct {
	// Spec is the newest live declaration's (the last process to start),
	// or, for a function no executor serves, its team's claim.
	Spec *protocol.FunctionSpec
	// Executors are the live declarations of the owning team, newest first.
	Executors []ExecutorStatus
	// Schemas counts the distinct schemas the executors declare; more than
	// one means the replicas disagree (a rollout, or a mistake).
	Schemas int
	// Accepted is the team's claim: the definition (description and
	// schema) last accepted, which agents read under
	// Options.DefinitionApproval.
	Accepted *protocol.FunctionSpec
}

// Changed reports whether the newest executor declares a definition
// (description or schema) other than the one last accepted.
func (s FunctionStatus) Changed() bool {
	return s.Accepted != nil && DefinitionDigest(s.Spec) != DefinitionDigest(s.Accepted)
}

// Served reports whether a live executor serves the function.
func (s FunctionStatus) Served() bool { return len(s.Executors) > 0 }

// ExecutorStatus is one executor process's live declaration.
type ExecutorStatus struct {
	Executor  string
	Instance  string
	StartedAt time.Time
	// Schema identifies the declared schema by content.
	Schema string
}

// Registry reads which team owns each function and which executor
// processes serve it now, sorted by name. Declarations of processes whose
// lease lapsed are gone (the server removes them); those of a team that
// does not own the name are left out.
func Registry(ctx context.Context, js jetstream.JetStream) ([]FunctionStatus, error) {
	claims, err := readBucket(ctx, js, protocol.RegistryBucket)
	if err != nil {
		return nil, err
	}
	decls, err := readBucket(ctx, js, protocol.DeclarationBucket)
	if err != nil {
		return nil, err
	}
	byName := map[string][]*protocol.Declaration{}
	for key, data := range decls {
		d, err := protocol.DecodeDeclaration(data)
		if err != nil || d.Key() != key {
			continue
		}
		byName[d.Spec.Name] = append(byName[d.Spec.Name], d)
	}
	var out []FunctionStatus
	for name, data := range claims {
		claim, err := protocol.DecodeFunctionSpec(data)
		if err != nil || claim.Name != name {
			continue
		}
		st := FunctionStatus{Spec: claim, Accepted: claim}
		live := slices.DeleteFunc(byName[name], func(d *protocol.Declaration) bool { return d.Spec.Team != claim.Team })
		slices.SortFunc(live, func(a, b *protocol.Declaration) int { return b.StartedAt.Compare(a.StartedAt) })
		schemas := map[string]bool{}
		for i, d := range live {
			if i == 0 {
				st.Spec = &d.Spec
			}
			digest := schema.Digest(d.Spec.Parameters)
			schemas[digest] = true
			st.Executors = append(st.Executors, ExecutorStatus{Executor: d.Executor, Instance: d.Instance, StartedAt: d.StartedAt, Schema: digest})
		}
		st.Schemas = len(schemas)
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b FunctionStatus) int { return strings.Compare(a.Spec.Name, b.Spec.Name) })
	return out, nil
}

// readBucket returns every key's value in a bucket; a bucket not created
// yet is empty.
func readBucket(ctx context.Context, js jetstream.JetStream, bucket string) (map[string][]byte, error) {
	kv, err := js.KeyValue(ctx, bucket)
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
	out := map[string][]byte{}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // deleted or expired meanwhile
		}
		out[k] = e.Value()
	}
	return out, nil
}

// Functions lists the functions live executors serve, by name, each as
// its newest live declaration describes it.
func Functions(ctx context.Context, js jetstream.JetStream) ([]*protocol.FunctionSpec, error) {
	all, err := Registry(ctx, js)
	if err != nil {
		return nil, err
	}
	var specs []*protocol.FunctionSpec
	for _, f := range all {
		if f.Served() {
			specs = append(specs, f.Spec)
		}
	}
	return specs, nil
}

// ToolDefinitions renders functions as the tool definitions a platform's
// agent configuration takes: Agents function tools, Assistants functions,
// or Responses functions. "strict" (Assistants, Responses) is set when the
// schema meets strict mode's rules: every object closed with
// additionalProperties false and every property required.
//
// A function marked DeferLoading is emitted with "defer_loading": true for
// Agents and Responses, and then one {"type":"tool_search"} tool follows
// the functions, so the model can load deferred ones on demand. Assistants
// have no such field: every function is emitted in full.
func ToolDefinitions(specs []*protocol.FunctionSpec, p protocol.Platform) ([]json.RawMessage, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p == protocol.PlatformMCP {
		return nil, errors.New("dispatch: MCP clients list the tools themselves (tools/list on /mcp); there are no definitions to give them")
	}
	out := make([]json.RawMessage, 0, len(specs))
	for _, s := range specs {
		var schema map[string]any
		if err := json.Unmarshal(s.Parameters, &schema); err != nil {
			return nil, fmt.Errorf("dispatch: schema of %s: %w", s.Name, err)
		}
		strict := strictCompatible(schema)
		var def map[string]any
		switch p {
		case protocol.PlatformAgents:
			def = map[string]any{"type": "function", "name": s.Name, "description": s.Description, "parameters": s.Parameters}
		case protocol.PlatformAssistants:
			def = map[string]any{"type": "function", "function": map[string]any{
				"name": s.Name, "description": s.Description, "parameters": s.Parameters, "strict": strict}}
		case protocol.PlatformResponses:
			def = map[string]any{"type": "function", "name": s.Name, "description": s.Description, "parameters": s.Parameters, "strict": strict}
		}
		if s.DeferLoading && p != protocol.PlatformAssistants {
			def["defer_loading"] = true
		}
		b, err := json.Marshal(def)
		if err != nil {
			return nil, err
		}
		out = append(out, b)
	}
	if p != protocol.PlatformAssistants && slices.ContainsFunc(specs, func(s *protocol.FunctionSpec) bool { return s.DeferLoading }) {
		out = append(out, json.RawMessage(`{"type":"tool_search"}`))
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
