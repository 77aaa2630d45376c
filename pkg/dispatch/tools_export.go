package dispatch

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

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
			out[i].Team, out[i].Function, out[i].DefinitionDigest = specs[i].Team, specs[i].Name, definitionDigest(specs[i])
		}
	}
	return out, nil
}

// getTools answers GET /v1/tools?platform=responses&team=a,b: the tool
// definitions of the functions live executors serve, of the caller's teams
// (and of those named by team, which must be the caller's), each with its
// team, as {"platform":..., "tools":[ExportedTool...]}.
func (d *Dispatcher) getTools(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	q := r.URL.Query()
	p := protocol.Platform(cmp.Or(q.Get("platform"), string(protocol.PlatformResponses)))
	if p.Validate() != nil || p == protocol.PlatformMCP {
		writeFieldError(w, &FieldError{Field: "platform", Message: "platform must be agents, assistants or responses"})
		return
	}
	sees := caller.Sees
	if list := q.Get("team"); list != "" {
		teams := strings.Split(list, ",")
		for _, t := range teams {
			if !caller.Sees(t) {
				writeQueryError(w, &FieldError{Field: "team", Err: ErrOutOfScope,
					Message: fmt.Sprintf("team %s is not one of your teams (%s)", t, strings.Join(caller.Teams, ", "))})
				return
			}
		}
		sees = func(team string) bool { return slices.Contains(teams, team) }
	}
	if !d.Ready() {
		writeError(w, http.StatusServiceUnavailable, "the dispatcher is starting or stopping; retry shortly")
		return
	}
	tools, err := ExportTools(d.registry.served(sees, d.opts.DefinitionApproval), p)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"platform": p, "tools": tools})
}
