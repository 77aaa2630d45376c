package tooldef

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Whose words a tool holds. A function's description and schema are its
// owning team's words, and they reach every agent given the tool. The
// platforms' function tool definitions have no field for where a tool
// comes from (and refuse unknown fields), so an export says it beside each
// definition: a Tool. MCP's tools/list says it in each tool's
// _meta ("io.toolrelay/team").

// Tool is one tool definition for a platform with the team whose words it
// holds.
type Tool struct {
	// Team owns the function: its executors wrote the description and the
	// schema. Empty for a tool toolrelay adds (tool_search).
	Team string `json:"team,omitempty"`
	// Function names the function; DefinitionDigest identifies its
	// description and schema (as GET /v1/functions shows it).
	Function         string `json:"function,omitempty"`
	DefinitionDigest string `json:"definition_digest,omitempty"`
	// Definition is what the platform takes, as Definitions renders it.
	Definition json.RawMessage `json:"definition"`
}

// Export renders specs as Definitions does, each definition with its
// owning team.
func Export(specs []*protocol.FunctionSpec, p protocol.Platform) ([]Tool, error) {
	defs, err := Definitions(specs, p)
	if err != nil {
		return nil, err
	}
	offered := slices.DeleteFunc(slices.Clone(specs), func(s *protocol.FunctionSpec) bool { return !Offered(s, p) })
	out := make([]Tool, len(defs))
	for i, def := range defs {
		out[i].Definition = def
		if i < len(offered) { // then tool_search, if any
			out[i].Team, out[i].Function, out[i].DefinitionDigest = offered[i].Team, offered[i].Name, dispatch.DefinitionDigest(offered[i])
		}
	}
	return out, nil
}

// Offered reports whether a platform can be given s: a custom tool (a
// function with a Format) only the Responses API can.
func Offered(s *protocol.FunctionSpec, p protocol.Platform) bool {
	return s.Format == nil || p == protocol.PlatformResponses
}

// NotOffered is a function an export leaves out, and why.
type NotOffered struct {
	Function string `json:"function"`
	Team     string `json:"team"`
	Reason   string `json:"reason"`
}

// Left lists the specs an export for p leaves out: custom tools, for a
// platform without them.
func Left(specs []*protocol.FunctionSpec, p protocol.Platform) []NotOffered {
	var out []NotOffered
	for _, s := range specs {
		if !Offered(s, p) {
			out = append(out, NotOffered{Function: s.Name, Team: s.Team,
				Reason: fmt.Sprintf("%s is a custom tool (it takes text, format %s); %s has no custom tools, only the Responses API does", s.Name, s.Format.Type, p)})
		}
	}
	return out
}

// Definitions renders functions as the tool definitions a platform's
// agent configuration takes: Agents function tools, Assistants functions,
// or Responses functions. "strict" (Assistants, Responses) is set when the
// schema meets strict mode's rules: every object closed with
// additionalProperties false and every property required.
//
// A function marked DeferLoading is emitted with "defer_loading": true for
// Agents and Responses, and then one {"type":"tool_search"} tool follows
// the functions, so the model can load deferred ones on demand. Assistants
// have no such field: every function is emitted in full.
//
// A custom tool (a function with a Format) is emitted for Responses as
// {"type":"custom",...} with its format; Agents sessions and Assistants
// have no custom tools, so it is left out for them (Left names it).
func Definitions(specs []*protocol.FunctionSpec, p protocol.Platform) ([]json.RawMessage, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	if p == protocol.PlatformMCP {
		return nil, errors.New("tooldef: MCP clients list the tools themselves (tools/list on /mcp); there are no definitions to give them")
	}
	out := make([]json.RawMessage, 0, len(specs))
	for _, s := range specs {
		if !Offered(s, p) {
			continue
		}
		if s.Format != nil {
			b, err := json.Marshal(customTool(s))
			if err != nil {
				return nil, err
			}
			out = append(out, b)
			continue
		}
		var schema map[string]any
		if err := json.Unmarshal(s.Parameters, &schema); err != nil {
			return nil, fmt.Errorf("tooldef: schema of %s: %w", s.Name, err)
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
	if p != protocol.PlatformAssistants && slices.ContainsFunc(specs, func(s *protocol.FunctionSpec) bool { return s.DeferLoading && Offered(s, p) }) {
		out = append(out, json.RawMessage(`{"type":"tool_search"}`))
	}
	return out, nil
}

// customTool is a Responses custom tool: {"type":"custom","name",
// "description","format":{"type":"text"} or {"type":"grammar","syntax",
// "definition"}}, as openai-go's responses.CustomToolParam has it.
func customTool(s *protocol.FunctionSpec) map[string]any {
	format := map[string]any{"type": s.Format.Type}
	if s.Format.Type == protocol.FormatGrammar {
		format["syntax"], format["definition"] = s.Format.Syntax, s.Format.Definition
	}
	def := map[string]any{"type": "custom", "name": s.Name, "description": s.Description, "format": format}
	if s.DeferLoading {
		def["defer_loading"] = true
	}
	return def
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
