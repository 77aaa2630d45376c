package platformsim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"text/template"
)

// Scenario is a scripted model: the calls it asks for when a prompt matches,
// step by step, and how its final answer is built from their outputs.
type Scenario struct {
	// Name identifies the scenario in logs and tests.
	Name string
	// Prompt selects the scenario: the user's input contains it
	// (case-insensitive). The first matching scenario wins.
	Prompt string
	// Steps are the rounds of calls; the calls of one step are asked for in
	// parallel, and a step's arguments may use outputs of earlier steps.
	Steps []Step
	// Answer is a text/template for the final answer. {{out "name"}} is the
	// output of the call named so (its As, or its function name).
	Answer string
	// Platform is where `dispatcher dev` plays the scenario: agents,
	// assistants or responses (the default). The simulator itself plays
	// any scenario on every platform.
	Platform string
}

// Step is one round of parallel calls.
type Step []CallSpec

// CallSpec is one call the model asks for.
type CallSpec struct {
	// Name is the function to call.
	Name string
	// Arguments is a text/template producing a JSON object; it may use
	// {{out "name"}} and {{json (out "name")}}.
	Arguments string
	// As names the output for later templates. Default: Name.
	As string
	// Kind is what the model emits: "" a function call; "custom" a
	// custom tool call (Responses custom_tool_call) whose Arguments
	// template renders the raw text input; any other value an item or
	// action of that type that toolrelay does not serve, as it appears on
	// the platform: a Responses output item ("mcp_approval_request",
	// "computer_call", or a type no SDK knows) or an Agents required action
	// ("environment_connection", "computer_use_approval_request"). Such an
	// item is never answered: the conversation waits on it.
	//
	// "tool_search" is a client-executed tool search (Responses
	// tool_search_call with execution "client"): Arguments renders the
	// query (text, sent as {"query": text}; or a JSON object, sent as
	// is), the client answers with a tool_search_output, and the output
	// later templates read is the names of the tools it loaded, joined
	// by commas. Name is optional; the output's default name is
	// "tool_search".
	Kind string
}

// Call kinds of a CallSpec.
const (
	KindFunction   = ""
	KindCustom     = "custom"
	KindToolSearch = "tool_search"
)

// answered reports whether the client answers the kind: a function, a
// custom tool or a client tool search.
func answeredKind(kind string) bool {
	return kind == KindFunction || kind == KindCustom || kind == KindToolSearch
}

func (c CallSpec) key() string {
	if c.As != "" {
		return c.As
	}
	if c.Name == "" && c.Kind == KindToolSearch {
		return "tool_search"
	}
	return c.Name
}

// Model picks a scenario for a prompt. The zero Model knows no scenario and
// answers every prompt without calling anything.
type Model struct {
	Scenarios []Scenario
}

// script is one scenario being played: a conversation's state.
type script struct {
	scenario *Scenario
	step     int
	outputs  map[string]string
	// pending maps call IDs of the current step to their spec.
	pending map[string]CallSpec
	order   []string
}

// clone copies the state, so that a conversation can fork (two
// continuations of one response).
func (s *script) clone() *script {
	c := &script{scenario: s.scenario, step: s.step, outputs: map[string]string{}, pending: map[string]CallSpec{}, order: slices.Clone(s.order)}
	for k, v := range s.outputs {
		c.outputs[k] = v
	}
	for k, v := range s.pending {
		c.pending[k] = v
	}
	return c
}

// modelCall is a call the model asks for.
type modelCall struct {
	ID        string
	Name      string
	Arguments string // JSON object; a custom call's raw text
	Kind      string // see CallSpec.Kind
}

func (m *Model) start(prompt string) *script {
	p := strings.ToLower(prompt)
	for i := range m.Scenarios {
		s := &m.Scenarios[i]
		if s.Prompt != "" && strings.Contains(p, strings.ToLower(s.Prompt)) {
			return &script{scenario: s, outputs: map[string]string{}}
		}
	}
	return &script{outputs: map[string]string{}}
}

// next returns the calls of the next step, or the final answer when no step
// is left. It is called once all calls of the previous step are answered.
func (s *script) next(newID func() string) (calls []modelCall, answer string, err error) {
	if s.scenario == nil {
		return nil, "I can only help with the scenarios this simulator was given.", nil
	}
	if s.step >= len(s.scenario.Steps) {
		answer, err := s.render(s.scenario.Answer)
		return nil, answer, err
	}
	step := s.scenario.Steps[s.step]
	s.step++
	s.pending = map[string]CallSpec{}
	s.order = s.order[:0]
	for _, spec := range step {
		args := spec.Arguments
		if args == "" {
			args = "{}"
		}
		if spec.Kind != KindFunction && spec.Arguments == "" {
			args = ""
		}
		rendered, err := s.render(args)
		if err != nil {
			return nil, "", err
		}
		id := newID()
		if spec.Kind != KindFunction {
			if answeredKind(spec.Kind) {
				s.pending[id] = spec
				s.order = append(s.order, id)
			}
			name := spec.Name
			if spec.Kind == KindToolSearch {
				rendered = searchArguments(rendered)
				name = cmpOr(name, "tool_search")
			}
			calls = append(calls, modelCall{ID: id, Name: name, Arguments: rendered, Kind: spec.Kind})
			continue
		}
		if !json.Valid([]byte(rendered)) {
			return nil, "", fmt.Errorf("platformsim: scenario %s: arguments of %s are not JSON: %s", s.scenario.Name, spec.Name, rendered)
		}
		s.pending[id] = spec
		s.order = append(s.order, id)
		calls = append(calls, modelCall{ID: id, Name: spec.Name, Arguments: compactJSON(rendered)})
	}
	return calls, "", nil
}

// answer records the output of a pending call. It reports whether the call
// was pending.
func (s *script) answer(callID, output string) bool {
	spec, ok := s.pending[callID]
	if !ok {
		return false
	}
	delete(s.pending, callID)
	s.outputs[spec.key()] = output
	return true
}

// waiting lists the pending call IDs in the order the model asked for them.
func (s *script) waiting() []string {
	var ids []string
	for _, id := range s.order {
		if _, ok := s.pending[id]; ok {
			ids = append(ids, id)
		}
	}
	return ids
}

func (s *script) render(text string) (string, error) {
	t, err := template.New(s.scenario.Name).Option("missingkey=error").Funcs(templateFuncs(s.outputs)).Parse(text)
	if err != nil {
		return "", fmt.Errorf("platformsim: scenario %s: %w", s.scenario.Name, err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, nil); err != nil {
		return "", fmt.Errorf("platformsim: scenario %s: %w", s.scenario.Name, err)
	}
	return b.String(), nil
}

// templateFuncs are the functions of argument and answer templates, over
// the outputs so far.
func templateFuncs(outputs map[string]string) template.FuncMap {
	return template.FuncMap{
		"out": func(name string) string { return outputs[name] },
		"json": func(v string) string {
			b, _ := json.Marshal(v)
			return string(b)
		},
		// field reads a top-level field of an output that is a JSON object.
		"field": func(v, name string) string {
			var m map[string]any
			if json.Unmarshal([]byte(v), &m) != nil {
				return v
			}
			if s, ok := m[name].(string); ok {
				return s
			}
			b, _ := json.Marshal(m[name])
			return string(b)
		},
	}
}

// searchArguments are a tool_search_call's arguments for a rendered
// query: a JSON object as is, other text as {"query": text}.
func searchArguments(query string) string {
	var obj map[string]any
	if json.Unmarshal([]byte(query), &obj) == nil && obj != nil {
		return compactJSON(query)
	}
	b, _ := json.Marshal(map[string]string{"query": query})
	return string(b)
}

func compactJSON(s string) string {
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(s)); err != nil {
		return s
	}
	return b.String()
}
