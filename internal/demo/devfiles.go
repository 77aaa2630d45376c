package demo

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/toolrelay/toolrelay/internal/functionsfile"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// devFiles are the files dispatcher dev follows: the functions file and,
// if given, the scenarios file. A change is taken once the file reads the
// same twice in a row, so a half-written save is never taken.
type devFiles struct {
	functions, scenarios string
	// taken is the content last loaded (or refused), seen the content of
	// the last poll; by path.
	taken, seen map[string][32]byte
}

// devChange is a change of one file: the new functions or scenarios, or
// why they were refused.
type devChange struct {
	path      string
	err       error
	teams     map[string][]exec.Function
	scenarios []platformsim.Scenario
}

func newDevFiles(functions, scenarios string) *devFiles {
	return &devFiles{functions: functions, scenarios: scenarios, taken: map[string][32]byte{}, seen: map[string][32]byte{}}
}

// load reads both files at start.
func (f *devFiles) load() (map[string][]exec.Function, []platformsim.Scenario, error) {
	teams, err := f.loadFunctions()
	if err != nil {
		return nil, nil, err
	}
	scenarios := defaultScenarios(teams)
	if f.scenarios != "" {
		if scenarios, err = f.loadScenarios(); err != nil {
			return nil, nil, err
		}
	}
	return teams, scenarios, nil
}

func (f *devFiles) loadFunctions() (map[string][]exec.Function, error) {
	f.remember(f.functions)
	return functionsfile.Load(f.functions)
}

func (f *devFiles) loadScenarios() ([]platformsim.Scenario, error) {
	f.remember(f.scenarios)
	return platformsim.LoadScenarios(f.scenarios)
}

func (f *devFiles) remember(path string) {
	if sum, ok := digest(path); ok {
		f.taken[path], f.seen[path] = sum, sum
	}
}

// poll returns the first file that changed and settled since it was last
// taken, loaded; nil when none did.
func (f *devFiles) poll() *devChange {
	for _, path := range []string{f.functions, f.scenarios} {
		if path == "" {
			continue
		}
		sum, ok := digest(path)
		if !ok || sum == f.taken[path] {
			f.seen[path] = sum
			continue
		}
		if sum != f.seen[path] {
			f.seen[path] = sum // changed: take it once it reads the same again
			continue
		}
		c := &devChange{path: path}
		if path == f.functions {
			c.teams, c.err = f.loadFunctions()
			if c.err == nil && f.scenarios == "" {
				c.scenarios = defaultScenarios(c.teams)
			}
		} else {
			c.scenarios, c.err = f.loadScenarios()
		}
		return c
	}
	return nil
}

func digest(path string) ([32]byte, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return [32]byte{}, false
	}
	return sha256.Sum256(b), true
}

func (f *devFiles) describeScenarios(n int) string {
	if f.scenarios == "" {
		return fmt.Sprintf("%d, one per function with arguments made up from its schema (-scenarios FILE to script your own)", n)
	}
	return fmt.Sprintf("%s (%d)", f.scenarios, n)
}

// unserved lists, for each scenario call of a function that neither the
// functions file declares nor another executor serves (a Go executor on
// the embedded JetStream, say), a warning: the call will fail as unknown.
func unserved(teams map[string][]exec.Function, elsewhere []string, scenarios []platformsim.Scenario) []string {
	served := map[string]bool{}
	for _, fns := range teams {
		for _, f := range fns {
			served[f.Name] = true
		}
	}
	for _, name := range elsewhere {
		served[name] = true
	}
	var out []string
	for _, sc := range scenarios {
		for _, step := range sc.Steps {
			for _, c := range step {
				if !served[c.Name] {
					out = append(out, fmt.Sprintf("scenario %s calls %s, which neither the functions file declares nor a running executor serves: "+
						"the call will fail as unknown_function unless an executor serving it joins (see docs/first-team.md)", sc.Name, c.Name))
					served[c.Name] = true // once
				}
			}
		}
	}
	return out
}

// defaultScenarios has one scenario per function, by name: the model calls
// it once with arguments made up from its schema and answers with the
// output. A custom tool (a function with a Format) is called as one, with
// the text "example" on the Responses API: a grammar's example is for the
// team's own scenarios to give.
func defaultScenarios(teams map[string][]exec.Function) []platformsim.Scenario {
	var fns []exec.Function
	for _, list := range teams {
		fns = append(fns, list...)
	}
	slices.SortFunc(fns, func(a, b exec.Function) int { return strings.Compare(a.Name, b.Name) })
	var out []platformsim.Scenario
	for _, fn := range fns {
		call := platformsim.CallSpec{Name: fn.Name, Arguments: exampleArguments(fn.Parameters)}
		if fn.Format != nil {
			call = platformsim.CallSpec{Name: fn.Name, Kind: platformsim.KindCustom, Arguments: "example"}
		}
		out = append(out, platformsim.Scenario{
			Name:   fn.Name,
			Prompt: "Please call " + fn.Name + " now.",
			Steps:  []platformsim.Step{{call}},
			Answer: fn.Name + " returned: {{out " + strconv.Quote(fn.Name) + "}}",
		})
	}
	return out
}

// exampleArguments makes up arguments that a JSON Schema accepts where it
// can: a value from const, default, examples or enum, else one of the
// property's type (the least a minimum allows). It cannot honour a pattern:
// give such a property examples.
func exampleArguments(schema json.RawMessage) string {
	var s map[string]any
	if json.Unmarshal(schema, &s) != nil {
		return "{}"
	}
	v, ok := exampleValue(s, 0).(map[string]any)
	if !ok {
		return "{}"
	}
	b, _ := json.Marshal(v)
	// The model's arguments are a template: keep "{{" in values literal.
	return strings.ReplaceAll(string(b), "{{", `{{"{{"}}`)
}

func exampleValue(s map[string]any, depth int) any {
	if depth > 8 {
		return nil
	}
	if v, ok := s["const"]; ok {
		return v
	}
	if v, ok := s["default"]; ok {
		return v
	}
	for _, key := range []string{"examples", "enum"} {
		if list, ok := s[key].([]any); ok && len(list) > 0 {
			return list[0]
		}
	}
	for _, key := range []string{"anyOf", "oneOf", "allOf"} {
		if list, ok := s[key].([]any); ok && len(list) > 0 {
			if m, ok := list[0].(map[string]any); ok {
				return exampleValue(m, depth+1)
			}
		}
	}
	typ, _ := s["type"].(string)
	if list, ok := s["type"].([]any); ok {
		for _, t := range list {
			if t, ok := t.(string); ok && t != "null" {
				typ = t
				break
			}
		}
	}
	if typ == "" && s["properties"] != nil {
		typ = "object"
	}
	number := func() float64 {
		if m, ok := s["minimum"].(float64); ok {
			return m
		}
		if m, ok := s["exclusiveMinimum"].(float64); ok {
			return m + 1
		}
		return 1
	}
	switch typ {
	case "object":
		obj := map[string]any{}
		props, _ := s["properties"].(map[string]any)
		names := []string{}
		if req, ok := s["required"].([]any); ok && len(req) > 0 {
			for _, r := range req {
				if name, ok := r.(string); ok {
					names = append(names, name)
				}
			}
		} else {
			for name := range props {
				names = append(names, name)
			}
		}
		for _, name := range names {
			sub, _ := props[name].(map[string]any)
			obj[name] = exampleValue(sub, depth+1)
		}
		return obj
	case "array":
		item, _ := s["items"].(map[string]any)
		n := 1
		if m, ok := s["minItems"].(float64); ok && m > 1 {
			n = int(m)
		}
		arr := make([]any, n)
		for i := range arr {
			arr[i] = exampleValue(item, depth+1)
		}
		return arr
	case "integer":
		return int(number())
	case "number":
		return number()
	case "boolean":
		return true
	case "null":
		return nil
	}
	// A string, or a schema that says nothing.
	switch s["format"] {
	case "date":
		return "2026-01-01"
	case "date-time":
		return "2026-01-01T00:00:00Z"
	case "email":
		return "user@example.com"
	case "uri", "url":
		return "https://example.com"
	case "uuid":
		return "00000000-0000-4000-8000-000000000000"
	}
	v := "example"
	if m, ok := s["minLength"].(float64); ok && int(m) > len(v) {
		v += strings.Repeat("x", int(m)-len(v))
	}
	return v
}
