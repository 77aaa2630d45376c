package dispatch

import (
	"encoding/json"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Whose words a tool holds. A function's description and schema are its
// owning team's words, and they reach every agent given the tool. The
// platforms' function tool definitions have no field for where a tool
// comes from (and refuse unknown fields), so an export says it beside each
// definition: an ExportedTool. MCP's tools/list says it in each tool's
// _meta ("io.toolrelay/team").

// ExportedTool is one tool definition for a platform with the team whose
// words it holds.
type ExportedTool struct {
	// Team owns the function: its executors wrote the description and the
	// schema. Empty for a tool toolrelay adds (tool_search).
	Team string `json:"team,omitempty"`
	// Function names the function; DefinitionDigest identifies its
	// description and schema (as GET /v1/functions shows it).
	Function         string `json:"function,omitempty"`
	DefinitionDigest string `json:"definition_digest,omitempty"`
	// Definition is what the platform takes, as ToolDefinitions renders it.
	Definition json.RawMessage `json:"definition"`
}

// ExportTools renders specs as ToolDefinitions does, each definition with
// its owning team.
func ExportTools(specs []*protocol.FunctionSpec, p protocol.Platform) ([]ExportedTool, error) {
	defs, err := ToolDefinitions(specs, p)
	if err != nil {
		return nil, err
	}
	out := make([]ExportedTool, len(defs))
	for i, def := range defs {
		out[i].Definition = def
		if i < len(specs) { // then tool_search, if any
			out[i].Team, out[i].Function, out[i].DefinitionDigest = specs[i].Team, specs[i].Name, DefinitionDigest(specs[i])
		}
	}
	return out, nil
}
