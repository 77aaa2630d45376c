// Package functionsfile reads a team's functions file: the YAML (or JSON)
// list of functions that `executor -config` and `dispatcher dev` serve,
// each run as a command or forwarded to an HTTP endpoint.
package functionsfile

import (
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/internal/yamlfile"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// fileConfig is a functions file: YAML, or JSON (which is YAML).
type fileConfig struct {
	Functions []functionConfig `yaml:"functions"`
}

type functionConfig struct {
	Name           string      `yaml:"name"`
	Description    string      `yaml:"description"`
	Parameters     *parameters `yaml:"parameters"`
	Owner          string      `yaml:"owner"`
	Timeout        string      `yaml:"timeout"`
	Concurrency    int         `yaml:"concurrency"`
	MaxConcurrency int         `yaml:"max_concurrency"`
	SideEffects    bool        `yaml:"side_effects"`
	Version        string      `yaml:"version"`
	DeferLoading   bool        `yaml:"defer_loading"`
	// Title, Icons and OutputSchema are what MCP clients show and get
	// beside the tool.
	Title        string         `yaml:"title"`
	Icons        []iconConfig   `yaml:"icons"`
	OutputSchema map[string]any `yaml:"output_schema"`
	// Approval holds calls for a person's decision before they run.
	Approval *approvalConfig `yaml:"approval"`
	// Format "text", or a Grammar, makes the function a custom tool that
	// takes the model's raw text instead of JSON parameters.
	Format  string         `yaml:"format"`
	Grammar *grammarConfig `yaml:"grammar"`
	Retry   *retryConfig   `yaml:"retry"`
	Command []string       `yaml:"command"`
	HTTP    *httpConfig    `yaml:"http"`
}

type retryConfig struct {
	MaxAttempts    int    `yaml:"max_attempts"`
	InitialBackoff string `yaml:"initial_backoff"`
	MaxBackoff     string `yaml:"max_backoff"`
}

type iconConfig struct {
	Src      string   `yaml:"src"`
	MIMEType string   `yaml:"mime_type"`
	Sizes    []string `yaml:"sizes"`
	Theme    string   `yaml:"theme"`
}

type httpConfig struct {
	URL string `yaml:"url"`
}

// grammarConfig constrains a custom tool's text: syntax lark or regex.
type grammarConfig struct {
	Syntax     string `yaml:"syntax"`
	Definition string `yaml:"definition"`
}

// Load reads a functions file. Unknown keys, a bad schema, a bad or
// duplicate name: the error names the file and the field, and nothing runs.
// Every function's mistakes are reported at once, one per line. Functions
// are grouped by owning team, in the file's order.
func Load(path string) (map[string][]exec.Function, error) {
	var fc fileConfig
	if err := yamlfile.Decode(path, &fc, "functions"); err != nil {
		return nil, err
	}
	if len(fc.Functions) == 0 {
		return nil, fmt.Errorf("%s: functions: the list is empty", path)
	}
	dir, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	teams := map[string][]exec.Function{}
	seen := map[string]int{}
	var errs []error
	for i, f := range fc.Functions {
		where := fmt.Sprintf("%s: functions[%d]", path, i)
		if f.Name != "" {
			where += " (" + f.Name + ")"
		}
		if j, dup := seen[f.Name]; dup && protocol.ValidateFunctionName(f.Name) == nil {
			errs = append(errs, fmt.Errorf("%s: name: %q is also declared by functions[%d]", where, f.Name, j))
			continue
		}
		seen[f.Name] = i
		fn, err := f.function(where, dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		teams[f.Owner] = append(teams[f.Owner], fn)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return teams, nil
}

// function turns one entry of the file into the exec.Function it declares,
// or an error naming where (the file and entry) and the field. dir is the
// file's directory, against which a relative command path is resolved.
func (f *functionConfig) function(where, dir string) (exec.Function, error) {
	fail := func(field, format string, args ...any) error {
		return fmt.Errorf("%s: %s: %s", where, field, fmt.Sprintf(format, args...))
	}
	var err error
	if err := protocol.ValidateFunctionName(f.Name); err != nil {
		return exec.Function{}, fail("name", "%q must match %s", f.Name, protocol.FunctionNamePattern)
	}
	if err := protocol.ValidateTeamName(f.Owner); err != nil {
		return exec.Function{}, fail("owner", "%q must be a team name matching %s", f.Owner, protocol.TeamNamePattern)
	}
	fn := exec.Function{
		Name: f.Name, Description: f.Description, Concurrency: f.Concurrency,
		MaxConcurrency: f.MaxConcurrency, SideEffects: f.SideEffects, Version: f.Version,
		DeferLoading: f.DeferLoading, Title: f.Title,
	}
	for _, ic := range f.Icons {
		fn.Icons = append(fn.Icons, protocol.Icon{Src: ic.Src, MIMEType: ic.MIMEType, Sizes: ic.Sizes, Theme: ic.Theme})
	}
	if f.Timeout != "" {
		if fn.Timeout, err = time.ParseDuration(f.Timeout); err != nil || fn.Timeout <= 0 {
			return exec.Function{}, fail("timeout", "%q is not a positive Go duration such as 30s", f.Timeout)
		}
	}
	if r := f.Retry; r != nil {
		if r.MaxAttempts < 0 {
			return exec.Function{}, fail("retry.max_attempts", "must not be negative")
		}
		fn.Retry = &exec.RetryPolicy{MaxAttempts: r.MaxAttempts}
		if fn.Retry.InitialBackoff, err = optionalDuration(r.InitialBackoff); err != nil {
			return exec.Function{}, fail("retry.initial_backoff", "%v", err)
		}
		if fn.Retry.MaxBackoff, err = optionalDuration(r.MaxBackoff); err != nil {
			return exec.Function{}, fail("retry.max_backoff", "%v", err)
		}
	}
	if f.Concurrency < 0 {
		return exec.Function{}, fail("concurrency", "must not be negative")
	}
	if f.MaxConcurrency < 0 {
		return exec.Function{}, fail("max_concurrency", "must not be negative")
	}
	if f.Parameters != nil {
		if fn.Parameters, err = json.Marshal(f.Parameters.schema); err != nil {
			return exec.Function{}, fail("parameters", "cannot be expressed as JSON: %v", err)
		}
	}
	if f.OutputSchema != nil {
		if fn.OutputSchema, err = json.Marshal(f.OutputSchema); err != nil {
			return exec.Function{}, fail("output_schema", "cannot be expressed as JSON: %v", err)
		}
	}
	if f.Approval != nil {
		policy := f.Approval.policy
		fn.Approval = &policy
	}
	if fn.Format, err = f.inputFormat(); err != nil {
		return exec.Function{}, fail("format", "%v", err)
	}
	switch {
	case f.Command != nil && f.HTTP != nil:
		return exec.Function{}, fail("command", "give either command or http, not both")
	case f.Command != nil:
		if fn.Handler, err = exec.CommandHandler(commandIn(dir, f.Command)); err != nil {
			return exec.Function{}, fail("command", "%v", err)
		}
	case f.HTTP != nil:
		if fn.Handler, err = exec.HTTPHandler(f.HTTP.URL, nil); err != nil {
			return exec.Function{}, fail("http.url", "%v", err)
		}
	default:
		return exec.Function{}, fail("command", "each function needs a command: [argv...] or an http: {url: ...}")
	}
	// Register's checks (the schema above all) run here too, so a bad
	// file never starts serving.
	probe, _ := exec.New(nil, f.Owner, exec.Options{})
	if err := probe.Register(fn); err != nil {
		return exec.Function{}, fail(registerField(err.Error()), "%s", withoutPrefixes(err.Error(), f.Name))
	}
	return fn, nil
}

// registerField is the field of the file a Register error is about: the
// parameters, unless it names the output schema, an icon or the title.
func registerField(msg string) string {
	switch {
	case strings.Contains(msg, "output schema") || strings.Contains(msg, "output_schema"):
		return "output_schema"
	case strings.Contains(msg, "icon"):
		return "icons"
	case strings.Contains(msg, ": title"):
		return "title"
	case strings.Contains(msg, "approval"):
		return "approval"
	}
	return "parameters"
}

// withoutPrefixes drops what Register's error repeats of where it is
// (where already says it): "exec: schema of f: " or
// "exec: function f: parameters: ".
func withoutPrefixes(msg, name string) string {
	for _, p := range []string{"exec: ", "approval: invalid policy: ", "protocol: malformed envelope: ", "function " + name + ": ", "approval: ", "parameters: ", "output schema: ", "schema of " + name + ": "} {
		msg = strings.TrimPrefix(msg, p)
	}
	return msg
}

// commandIn resolves a command given by a relative path (./bin/x, bin/x)
// against dir, the functions file's directory, so the file means the same
// from any working directory. A bare name (python3) is looked up in PATH,
// and an absolute path stays as it is.
func commandIn(dir string, argv []string) []string {
	if len(argv) == 0 || filepath.IsAbs(argv[0]) || !strings.ContainsRune(argv[0], filepath.Separator) && !strings.ContainsRune(argv[0], '/') {
		return argv
	}
	out := slices.Clone(argv)
	out[0] = filepath.Join(dir, argv[0])
	return out
}

// optionalDuration parses a positive Go duration; "" is zero (the default).
func optionalDuration(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive Go duration such as 200ms", s)
	}
	return d, nil
}

// inputFormat is the format of a custom tool (format: text, or a grammar:
// with syntax lark or regex), or nil for a function with parameters.
func (f *functionConfig) inputFormat() (*protocol.InputFormat, error) {
	if f.Format == "" && f.Grammar == nil {
		return nil, nil
	}
	if f.Parameters != nil {
		return nil, fmt.Errorf("a custom tool (format or grammar) takes text: remove parameters, or remove format and grammar")
	}
	in := &protocol.InputFormat{Type: f.Format}
	if f.Grammar != nil {
		if f.Format != "" && f.Format != protocol.FormatGrammar {
			return nil, fmt.Errorf("format %q with a grammar: leave format out, or set it to %q", f.Format, protocol.FormatGrammar)
		}
		in = &protocol.InputFormat{Type: protocol.FormatGrammar, Syntax: f.Grammar.Syntax, Definition: f.Grammar.Definition}
	}
	if err := in.Validate(f.Name); err != nil {
		return nil, fmt.Errorf("%s", strings.TrimPrefix(err.Error(), protocol.ErrMalformed.Error()+": "))
	}
	return in, nil
}
