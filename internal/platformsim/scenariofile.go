package platformsim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"text/template/parse"

	"go.yaml.in/yaml/v3"

	"github.com/toolrelay/toolrelay/internal/yamlfile"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A scenarios file scripts the model for a team's own functions: YAML with
// a top-level scenarios: list (see testdata/scenarios.yaml and
// docs/operations.md). Unknown keys, bad templates, outputs used before a
// step makes them and prompts that could never be played are errors naming
// the file and the field.

type scenariosFile struct {
	Scenarios []scenarioConfig `yaml:"scenarios"`
}

type scenarioConfig struct {
	Name     string `yaml:"name"`
	Prompt   string `yaml:"prompt"`
	Platform string `yaml:"platform"`
	// Calls is the shorthand for a single step.
	Calls  []callConfig `yaml:"calls"`
	Steps  []stepConfig `yaml:"steps"`
	Answer string       `yaml:"answer"`
}

type stepConfig struct {
	Calls []callConfig `yaml:"calls"`
}

type callConfig struct {
	Function string `yaml:"function"`
	// Arguments is a mapping (string values may hold template actions and
	// stay strings) or a string: a template that renders to a JSON object.
	Arguments yaml.Node `yaml:"arguments"`
	As        string    `yaml:"as"`
	// Kind is CallSpec.Kind: custom (a custom tool call whose input is
	// Input, a template of text), tool_search (a client tool search whose
	// query is Input; function is then optional), or the type of an item or action no
	// one answers (mcp_approval_request, computer_call,
	// environment_connection, ...; function is then optional).
	Kind  string `yaml:"kind"`
	Input string `yaml:"input"`
}

// LoadScenarios reads a scenarios file. Each scenario's calls, arguments
// and answer are checked before anything runs.
func LoadScenarios(path string) ([]Scenario, error) {
	var f scenariosFile
	if err := yamlfile.Decode(path, &f, "scenarios"); err != nil {
		return nil, err
	}
	if len(f.Scenarios) == 0 {
		return nil, fmt.Errorf("%s: scenarios: the list is empty", path)
	}
	var out []Scenario
	for i, sc := range f.Scenarios {
		where := fmt.Sprintf("%s: scenarios[%d]", path, i)
		if sc.Name != "" {
			where += " (" + sc.Name + ")"
		}
		s, err := sc.scenario(i)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		for j, prev := range out {
			if strings.Contains(strings.ToLower(s.Prompt), strings.ToLower(prev.Prompt)) {
				return nil, fmt.Errorf("%s: prompt: %q contains the prompt of scenarios[%d] (%s), which is matched first, so this scenario would never play",
					where, s.Prompt, j, prev.Name)
			}
			if s.Name == prev.Name {
				return nil, fmt.Errorf("%s: name: %q is also the name of scenarios[%d]", where, s.Name, j)
			}
		}
		out = append(out, s)
	}
	return out, nil
}

// scenario checks one scenario and turns it into the model's form.
func (sc *scenarioConfig) scenario(index int) (Scenario, error) {
	s := Scenario{Name: sc.Name, Prompt: strings.TrimSpace(sc.Prompt), Platform: sc.Platform}
	if s.Name == "" {
		s.Name = fmt.Sprintf("scenario-%d", index+1)
	}
	if s.Prompt == "" {
		return s, errors.New("prompt: missing; the user's message that starts the scenario")
	}
	if s.Platform != "" && !slices.Contains(protocol.Platforms, protocol.Platform(s.Platform)) {
		return s, fmt.Errorf("platform: %q is not agents, assistants or responses", s.Platform)
	}
	steps := sc.Steps
	prefix := "steps[%d]."
	switch {
	case len(sc.Calls) > 0 && len(sc.Steps) > 0:
		return s, errors.New("calls: give either calls (one step) or steps, not both")
	case len(sc.Calls) > 0:
		steps = []stepConfig{{Calls: sc.Calls}}
		prefix = ""
	}
	made := map[string]bool{} // outputs of earlier steps
	var keys []string
	for i, st := range steps {
		field := func(j int, name string) string {
			p := prefix
			if p != "" {
				p = fmt.Sprintf(p, i)
			}
			return fmt.Sprintf("%scalls[%d].%s", p, j, name)
		}
		if len(st.Calls) == 0 {
			return s, fmt.Errorf(prefix+"calls: a step needs at least one call", i)
		}
		var step Step
		thisStep := map[string]bool{}
		for j, c := range st.Calls {
			unserved := !answeredKind(c.Kind)
			if err := protocol.ValidateFunctionName(c.Function); err != nil && !((unserved || c.Kind == KindToolSearch) && c.Function == "") {
				return s, fmt.Errorf("%s: %q must match %s", field(j, "function"), c.Function, protocol.FunctionNamePattern)
			}
			spec := CallSpec{Name: c.Function, As: c.As, Kind: c.Kind}
			if c.Kind != KindFunction {
				if unserved && spec.As == "" {
					spec.As = c.Kind + strconv.Itoa(j)
				}
				if thisStep[spec.key()] {
					return s, fmt.Errorf("%s: two calls of this step are named %q; give one an as: name", field(j, "as"), spec.key())
				}
				thisStep[spec.key()] = true
				if err := checkTemplate(c.Input, made, false); err != nil {
					return s, fmt.Errorf("%s: %w", field(j, "input"), err)
				}
				spec.Arguments = c.Input
				step = append(step, spec)
				continue
			}
			if thisStep[spec.key()] {
				return s, fmt.Errorf("%s: two calls of this step are named %q; give one an as: name", field(j, "as"), spec.key())
			}
			thisStep[spec.key()] = true
			args, err := argumentsTemplate(&c.Arguments)
			if err != nil {
				return s, fmt.Errorf("%s: %w", field(j, "arguments"), err)
			}
			if err := checkTemplate(args, made, true); err != nil {
				return s, fmt.Errorf("%s: %w", field(j, "arguments"), err)
			}
			spec.Arguments = args
			step = append(step, spec)
		}
		for _, c := range step {
			if !made[c.key()] {
				keys = append(keys, c.key())
			}
			made[c.key()] = true
		}
		s.Steps = append(s.Steps, step)
	}
	s.Answer = sc.Answer
	if s.Answer == "" {
		// The default answer shows every output.
		var lines []string
		for _, k := range keys {
			lines = append(lines, k+": {{out "+strconv.Quote(k)+"}}")
		}
		s.Answer = strings.Join(lines, "\n")
		if s.Answer == "" {
			s.Answer = "(no function was called)"
		}
	}
	if err := checkTemplate(s.Answer, made, false); err != nil {
		return s, fmt.Errorf("answer: %w", err)
	}
	return s, nil
}

// argumentsTemplate turns a call's arguments into the model's template
// text. A mapping becomes its JSON, each string value that holds template
// actions rendered and inserted as a JSON string; a string is a template
// of its own.
func argumentsTemplate(n *yaml.Node) (string, error) {
	if n.Kind == 0 {
		return "{}", nil
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" {
		return n.Value, nil
	}
	if n.Kind != yaml.MappingNode {
		return "", fmt.Errorf("line %d: want a mapping of argument names to values, or a string template that renders to a JSON object", n.Line)
	}
	var b strings.Builder
	if err := writeJSONTemplate(&b, n); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSONTemplate(b *strings.Builder, n *yaml.Node) error {
	switch n.Kind {
	case yaml.AliasNode:
		return writeJSONTemplate(b, n.Alias)
	case yaml.MappingNode:
		b.WriteByte('{')
		for i := 0; i+1 < len(n.Content); i += 2 {
			if i > 0 {
				b.WriteByte(',')
			}
			k, _ := json.Marshal(n.Content[i].Value)
			b.Write(k)
			b.WriteByte(':')
			if err := writeJSONTemplate(b, n.Content[i+1]); err != nil {
				return err
			}
		}
		b.WriteByte('}')
	case yaml.SequenceNode:
		b.WriteByte('[')
		for i, c := range n.Content {
			if i > 0 {
				b.WriteByte(',')
			}
			if err := writeJSONTemplate(b, c); err != nil {
				return err
			}
		}
		b.WriteByte(']')
	case yaml.ScalarNode:
		var v any
		if err := n.Decode(&v); err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		if s, ok := v.(string); ok && strings.Contains(s, "{{") {
			expr, err := stringExpression(s)
			if err != nil {
				return fmt.Errorf("line %d: %q: %w", n.Line, s, err)
			}
			b.WriteString("{{json " + expr + "}}")
			return nil
		}
		j, err := json.Marshal(v)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		b.Write(j)
	default:
		return fmt.Errorf("line %d: unsupported YAML node", n.Line)
	}
	return nil
}

// stringExpression turns a template such as `Order {{out "id"}}` into one
// expression that evaluates to its text: (print "Order " (out "id")).
func stringExpression(text string) (string, error) {
	t, err := template.New("value").Funcs(templateFuncs(nil)).Parse(text)
	if err != nil {
		return "", err
	}
	parts := []string{"print"}
	for _, n := range t.Root.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			parts = append(parts, strconv.Quote(string(n.Text)))
		case *parse.ActionNode:
			if len(n.Pipe.Decl) > 0 {
				return "", errors.New("variables are not supported in argument values")
			}
			parts = append(parts, "("+n.Pipe.String()+")")
		default:
			return "", errors.New("only {{...}} actions are supported in argument values; write arguments as a string template for more")
		}
	}
	return "(" + strings.Join(parts, " ") + ")", nil
}

// checkTemplate parses text with the model's functions, refuses {{out}} of
// an output no earlier step makes, and, for arguments, renders it with
// every output as 0 to see that it is a JSON object.
func checkTemplate(text string, made map[string]bool, arguments bool) error {
	t, err := template.New("check").Option("missingkey=error").Funcs(templateFuncs(nil)).Parse(text)
	if err != nil {
		return err
	}
	var unknown []string
	walkOuts(t.Root, func(name string) {
		if !made[name] && !slices.Contains(unknown, name) {
			unknown = append(unknown, name)
		}
	})
	if len(unknown) > 0 {
		var known []string
		for k := range made {
			known = append(known, strconv.Quote(k))
		}
		slices.Sort(known)
		avail := "none (the first step's arguments cannot use outputs)"
		if len(known) > 0 {
			avail = strings.Join(known, ", ")
		}
		return fmt.Errorf("{{out %q}}: no earlier step makes that output; available: %s", unknown[0], avail)
	}
	outputs := map[string]string{}
	for k := range made {
		outputs[k] = "0"
	}
	t, _ = template.New("check").Option("missingkey=error").Funcs(templateFuncs(outputs)).Parse(text)
	var b bytes.Buffer
	if err := t.Execute(&b, nil); err != nil {
		return err
	}
	if arguments {
		var obj map[string]any
		if err := json.Unmarshal(b.Bytes(), &obj); err != nil {
			return fmt.Errorf("does not render to a JSON object (rendered with each output as 0: %s): %w", b.String(), err)
		}
	}
	return nil
}

// walkOuts calls f with the name of each {{out "name"}} in the tree.
func walkOuts(n parse.Node, f func(string)) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walkOuts(c, f)
		}
	case *parse.ActionNode:
		walkOuts(n.Pipe, f)
	case *parse.PipeNode:
		if n == nil {
			return
		}
		for _, c := range n.Cmds {
			walkOuts(c, f)
		}
	case *parse.CommandNode:
		if len(n.Args) > 1 {
			if id, ok := n.Args[0].(*parse.IdentifierNode); ok && id.Ident == "out" {
				if s, ok := n.Args[1].(*parse.StringNode); ok {
					f(s.Text)
				}
			}
		}
		for _, a := range n.Args {
			walkOuts(a, f)
		}
	case *parse.IfNode:
		walkBranch(&n.BranchNode, f)
	case *parse.RangeNode:
		walkBranch(&n.BranchNode, f)
	case *parse.WithNode:
		walkBranch(&n.BranchNode, f)
	}
}

func walkBranch(n *parse.BranchNode, f func(string)) {
	walkOuts(n.Pipe, f)
	walkOuts(n.List, f)
	walkOuts(n.ElseList, f)
}
