package platformsim

import (
	"fmt"
	"regexp"
	"slices"
)

// Tool definitions on an agent (Agents sessions) or a response (Responses):
// function tools, possibly deferred, custom tools with their input format,
// and the tool_search tool that loads deferred ones. Other tool types pass
// through unchecked.

// checkTools validates the function, custom and tool_search tools of a request the
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
		case "custom":
			if name, ok := t["name"].(string); !ok || name == "" {
				return invalid(fmt.Sprintf("Missing required parameter: '%s'.", at("name")), at("name"))
			}
			if aerr := checkCustomFormat(t["format"], at("format")); aerr != nil {
				return aerr
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

// checkCustomFormat validates a custom tool's format, at field: absent
// (unconstrained text), {"type":"text"}, or a grammar with a syntax of
// lark or regex and a definition; a regex must compile.
func checkCustomFormat(format any, field string) *apiError {
	if format == nil {
		return nil
	}
	f, ok := format.(map[string]any)
	if !ok {
		return invalid(fmt.Sprintf("Invalid type for '%s': expected an object.", field), field)
	}
	switch f["type"] {
	case "text":
		return nil
	case "grammar":
	default:
		return invalid(fmt.Sprintf("Invalid value for '%s.type': must be 'text' or 'grammar'.", field), field+".type")
	}
	def, _ := f["definition"].(string)
	if def == "" {
		return invalid(fmt.Sprintf("Missing required parameter: '%s.definition'.", field), field+".definition")
	}
	switch f["syntax"] {
	case "lark":
	case "regex":
		if _, err := regexp.Compile(def); err != nil {
			return invalid(fmt.Sprintf("Invalid regex grammar in '%s.definition': %v.", field, err), field+".definition")
		}
	default:
		return invalid(fmt.Sprintf("Invalid value for '%s.syntax': must be 'lark' or 'regex'.", field), field+".syntax")
	}
	return nil
}
