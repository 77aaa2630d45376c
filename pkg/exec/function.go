package exec

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/approval"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Function is a function an executor serves.
type Function struct {
	// Name is what the model calls; it must match ^[a-zA-Z0-9_-]{1,64}$.
	Name string
	// Description tells the model what the function does: at most
	// protocol.MaxDescriptionSize bytes, without invisible or control
	// characters (see protocol.ValidateToolText, which Register applies to
	// it and to the strings of Parameters).
	Description string
	// Parameters is the JSON Schema of the arguments. Default: derived
	// from the arguments type of a [TypedHandler] (see [SchemaFor]), else
	// an object with no declared properties. Register refuses a key that
	// misspells a keyword ("requird"), which JSON Schema would ignore.
	Parameters json.RawMessage
	// Handler runs the function. Required.
	Handler Handler
	// Timeout bounds one run. Default: none beyond the call's deadline.
	Timeout time.Duration
	// Concurrency is how many calls this process runs at once.
	// Default: 8.
	Concurrency int
	// MaxConcurrency caps the calls running at once across every replica
	// (the consumer's MaxAckPending). Default: 1000.
	MaxConcurrency int
	// SideEffects marks a function that must not run twice for one call.
	// An attempt that may have run without recording a result (its
	// executor died, or was shut down mid-run) is never re-run blindly:
	// Reconcile decides, or the call fails saying it may have run.
	SideEffects bool
	// Reconcile, for a SideEffects function, is called instead of Handler
	// when an earlier attempt may have run. It returns the output to give
	// the model (for instance after finding the effect by the call key), an
	// error, or ErrDidNotRun to run Handler normally. Optional.
	Reconcile Handler
	// Retry overrides the executor's RetryPolicy for this function.
	Retry *RetryPolicy
	// Version is a label of the implementation, shown in the registry.
	Version string
	// DeferLoading asks agents to load the function's definition on demand
	// (a tool_search tool finds it) rather than carry it in every request;
	// `dispatcher tools` emits it so for Agents and Responses. Default:
	// false.
	DeferLoading bool
	// Format, when set, makes the function a custom tool for the
	// Responses API: it takes the model's raw text instead of JSON
	// arguments (Parameters must be empty), free or constrained by a
	// grammar. Handlers read the text with [Invocation.Input]. A regex
	// grammar is checked before a call goes out; a Lark grammar is the
	// platform's to enforce. Platforms without custom tools (Agents
	// sessions, Assistants) are not offered the function. Default: nil,
	// JSON arguments.
	Format *protocol.InputFormat
	// Title is a short name for people, which MCP clients show instead of
	// Name: at most protocol.MaxTitleSize bytes of tool text. Optional.
	Title string
	// Icons are images MCP clients may show beside the tool (https or
	// data:image/ URLs; see protocol.Icon). Optional.
	Icons []protocol.Icon
	// OutputSchema, when set, is the JSON Schema of the output, a JSON
	// object: MCP clients get it as the tool's outputSchema, and an output
	// that does not match it reaches them as an error. Optional.
	OutputSchema json.RawMessage
	// Approval, when set, holds the function's calls (all, or those its
	// CEL condition over args picks) for a person's decision before any
	// executor sees them; a call denied, or not decided in time, reaches
	// the model as a failure saying so (see package approval). Register
	// compiles the condition. Optional.
	Approval *protocol.ApprovalPolicy

	schema *schema.Schema
}

const (
	defaultConcurrency    = 8
	defaultMaxConcurrency = 1000
)

// parameterized is a handler that knows its arguments' schema
// ([TypedHandler]).
type parameterized interface {
	parameters() (json.RawMessage, error)
}

func (f *Function) validate() error {
	if err := protocol.ValidateFunctionName(f.Name); err != nil {
		return err
	}
	if f.Handler == nil {
		return fmt.Errorf("exec: function %s has no handler", f.Name)
	}
	var err error
	if f.Format != nil {
		err = f.validateText()
	} else {
		err = f.validateParameters()
	}
	if err != nil {
		return err
	}
	if f.Timeout < 0 || f.Concurrency < 0 || f.MaxConcurrency < 0 {
		return fmt.Errorf("exec: function %s: timeout and concurrency must not be negative", f.Name)
	}
	if f.Reconcile != nil && !f.SideEffects {
		return fmt.Errorf("exec: function %s: Reconcile is only for SideEffects functions", f.Name)
	}
	if f.Concurrency == 0 {
		f.Concurrency = defaultConcurrency
	}
	if f.MaxConcurrency == 0 {
		f.MaxConcurrency = defaultMaxConcurrency
	}
	return nil
}

// validateParameters defaults and compiles the JSON Schema of the
// arguments.
func (f *Function) validateParameters() error {
	if len(f.Parameters) == 0 {
		f.Parameters = json.RawMessage(`{"type":"object","properties":{}}`)
		if typed, ok := f.Handler.(parameterized); ok {
			p, err := typed.parameters()
			if err != nil {
				return fmt.Errorf("exec: function %s: %w", f.Name, err)
			}
			f.Parameters = p
		}
	}
	if err := protocol.ValidateToolText(f.Name, f.Description, f.Parameters); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	s, err := schema.Compile(f.Name, f.Parameters)
	if err != nil {
		return fmt.Errorf("exec: %w", err) // "schema of <name>: ..."
	}
	if err := objectAtTop(f.Parameters); err != nil {
		return fmt.Errorf("exec: function %s: parameters: %w", f.Name, err)
	}
	if err := noMisspellings(f.Parameters); err != nil {
		return fmt.Errorf("exec: function %s: parameters: %w", f.Name, err)
	}
	f.schema = s
	return nil
}

// validateText checks a custom tool's format and compiles the checker of
// its input.
func (f *Function) validateText() error {
	if len(f.Parameters) > 0 {
		return fmt.Errorf("exec: function %s: a function with a Format takes text; leave Parameters empty", f.Name)
	}
	if err := f.Format.Validate(f.Name); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if err := protocol.ValidateToolText(f.Name, f.Description, nil); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	re, err := f.Format.Regex()
	if err != nil {
		return fmt.Errorf("exec: function %s: %w", f.Name, err)
	}
	src, _ := json.Marshal(f.Format)
	f.schema = schema.CompileText(f.Name, src, re)
	return nil
}

func (f *Function) spec(team string, now time.Time) *protocol.FunctionSpec {
	return &protocol.FunctionSpec{
		Version:         protocol.Version,
		Name:            f.Name,
		Description:     f.Description,
		Parameters:      f.Parameters,
		Team:            team,
		Timeout:         protocol.Duration(f.Timeout),
		MaxConcurrency:  f.MaxConcurrency,
		SideEffects:     f.SideEffects,
		FunctionVersion: f.Version,
		DeferLoading:    f.DeferLoading,
		Format:          f.Format,
		Title:           f.Title,
		Icons:           f.Icons,
		OutputSchema:    f.OutputSchema,
		Approval:        f.Approval,
		UpdatedAt:       now.UTC(),
	}
}

// validateMetadata checks what team's declaration of f will say beside
// its schema: the title, the icons and the output schema, which must
// compile and be an object at the top, as the dispatchers require.
func (f *Function) validateMetadata(team string) error {
	spec := f.spec(team, time.Now())
	if err := spec.Validate(); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if err := spec.ValidateToolText(); err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if f.Approval != nil {
		if _, err := approval.Compile(f.Name, team, f.Approval); err != nil {
			return fmt.Errorf("exec: %w", err)
		}
	}
	if len(f.OutputSchema) == 0 {
		return nil
	}
	if _, err := schema.Compile(f.Name, f.OutputSchema); err != nil {
		return fmt.Errorf("exec: output schema: %w", err)
	}
	if err := objectAtTop(f.OutputSchema); err != nil {
		return fmt.Errorf("exec: function %s: output schema: %w", f.Name, err)
	}
	if err := noMisspellings(f.OutputSchema); err != nil {
		return fmt.Errorf("exec: function %s: output schema: %w", f.Name, err)
	}
	return nil
}

// noMisspellings refuses a schema with a key that is a keyword misspelt
// ("requird"): JSON Schema ignores unknown keys, so the schema would
// check less than its author meant. Keys far from any keyword pass.
func noMisspellings(raw json.RawMessage) error {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	var msgs []string
	for _, m := range schema.Misspellings(doc) {
		msgs = append(msgs, m.String())
	}
	if len(msgs) > 0 {
		return errors.New(strings.Join(msgs, "; "))
	}
	return nil
}

// objectAtTop refuses a schema whose top level is not an object: every
// platform passes a function's arguments as one JSON object, so a schema
// of another type would refuse every call (and platforms refuse it as a
// tool definition).
func objectAtTop(raw json.RawMessage) error {
	var top struct {
		Type any `json:"type"`
	}
	if err := json.Unmarshal(raw, &top); err != nil {
		return err
	}
	if top.Type == nil || top.Type == "object" {
		return nil
	}
	t, _ := json.Marshal(top.Type)
	return fmt.Errorf(`the top level must be an object schema ("type": "object"), not "type": %s: a function's arguments always arrive as one JSON object; put the value in a property`, t)
}
