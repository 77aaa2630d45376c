package platformsim

import (
	"fmt"
	"slices"
)

// Tool definitions on an agent (Agents sessions) or a response (Responses):
// function tools, possibly deferred, and the tool_search tool that loads
// deferred ones. Other tool types pass through unchecked.

// checkTools validates the function and tool_search tools of a request the
// way the platform's request types define them, so a configuration the
// platform would refuse is refused here too. param names the list
// ("agent.tools" or "tools"); agents selects the Agents rules (a function
// needs a description; tool_search has no fields).
func checkTools(tools []map[string]any, param string, agents bool) *apiError {
	deferred, searches := "", 0
	for i, t := range tools {
		at := func(field string) string { return fmt.Sprintf("%s[%d].%s", param, i, field) }
		switch t["type"] {
		case "function":
			if name, ok := t["name"].(string); !ok || name == "" {
				return invalid(fmt.Sprintf("Missing required parameter: '%s'.", at("name")), at("name"))
			}
			if _, ok := t["parameters"].(map[string]any); !ok && (agents || t["parameters"] != nil) {
				return invalid(fmt.Sprintf("Invalid value for '%s': expected a JSON Schema object.", at("parameters")), at("parameters"))
			}
			if _, ok := t["description"].(string); agents && !ok {
				return invalid(fmt.Sprintf("Missing required parameter: '%s'.", at("description")), at("description"))
			}
			for _, flag := range []string{"defer_loading", "async", "strict"} {
				if v, ok := t[flag]; ok && v != nil {
					if _, isBool := v.(bool); !isBool {
						return invalid(fmt.Sprintf("Invalid type for '%s': expected a boolean.", at(flag)), at(flag))
					}
				}
			}
			if _, ok := t["strict"]; ok && agents {
				return invalid(fmt.Sprintf("Unknown parameter: '%s'.", at("strict")), at("strict"))
			}
			if t["defer_loading"] == true && deferred == "" {
				deferred = t["name"].(string)
			}
		case "tool_search":
			searches++
			for k, v := range t {
				switch {
				case k == "type":
				case !agents && k == "execution":
					if !slices.Contains([]any{"server", "client"}, v) {
						return invalid(fmt.Sprintf("Invalid value for '%s': must be 'server' or 'client'.", at(k)), at(k))
					}
				case !agents && (k == "description" || k == "parameters"):
				default:
					return invalid(fmt.Sprintf("Unknown parameter: '%s'.", at(k)), at(k))
				}
			}
		}
	}
	switch {
	case searches > 1:
		return invalid(fmt.Sprintf("Invalid '%s': at most one tool_search tool is allowed.", param), param)
	case deferred != "" && searches == 0:
		return invalid(fmt.Sprintf("Invalid '%s': function %s is deferred (defer_loading: true), which needs a {\"type\":\"tool_search\"} tool to load it.", param, deferred), param)
	}
	return nil
}
