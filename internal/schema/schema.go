// Package schema compiles functions' JSON Schemas and checks arguments
// against them, with messages written for the model. It wraps
// santhosh-tekuri/jsonschema, a maintained validator of drafts 4 to 2020-12.
//
// It may import only that validator (and internal/suggest, for "did you
// mean"); pkg/dispatch and pkg/exec use it.
package schema

import (
	"bytes"
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// Schema is a compiled parameter schema. It is safe for concurrent use.
type Schema struct {
	function string
	digest   string
	s        *jsonschema.Schema
	// text marks the input of a custom tool (CompileText): a JSON string,
	// matching grammar when there is one.
	text    bool
	grammar *regexp.Regexp
	// perValue bounds the applications a value takes, or is 0 (see
	// perValue): arguments are counted only when the bound may pass
	// MaxSteps.
	perValue int64
}

// Digest identifies a schema by its content, whatever its key order and
// spacing: 16 hex characters. Numbers are kept as written (not rounded to
// float64, which would give {"maximum": 9007199254740993} the digest of
// 9007199254740992), so schemas the validator tells apart differ here too.
func Digest(raw []byte) string {
	var v any
	canonical := raw
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if dec.Decode(&v) == nil {
		if b, err := json.Marshal(v); err == nil {
			canonical = b
		}
	}
	sum := sha256.Sum256(bytes.TrimSpace(canonical))
	return hex.EncodeToString(sum[:8])
}

// Digest returns the Digest of the schema s was compiled from.
func (s *Schema) Digest() string { return s.digest }

// Compile compiles the parameter schema of function. The schema must be a
// self-contained JSON object: references to other documents are refused.
// A schema over one of the bounds in limits.go is refused with a
// LimitError before it is compiled; compiling takes at most
// CompileTimeout. Compile is safe for concurrent use; at most
// maxCompiling schemas compile at once.
func Compile(function string, raw []byte) (*Schema, error) {
	if err := checkLimits(function, raw); err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema of %s: not JSON: %w", function, err)
	}
	if _, ok := doc.(map[string]any); !ok {
		return nil, fmt.Errorf("schema of %s: must be a JSON object", function)
	}
	s, err := compileWithin(function, doc, CompileTimeout)
	if err != nil {
		return nil, err
	}
	if err := checkInPlace(function, s); err != nil {
		return nil, err
	}
	return &Schema{function: function, digest: Digest(raw), s: s, perValue: perValue(s)}, nil
}

// maxCompiling bounds the compilations running at once, those given up
// on for taking too long included.
const maxCompiling = 2

var compiling = make(chan struct{}, maxCompiling)

// compileWithin compiles doc, giving up after timeout. A compilation given
// up on runs to its end on its own goroutine, holding its place among
// maxCompiling; the bounds checked before it keep that end near.
func compileWithin(function string, doc any, timeout time.Duration) (*jsonschema.Schema, error) {
	over := &LimitError{Function: function, Limit: "CompileTimeout", What: "the time to compile it, in milliseconds,",
		Got: timeout.Milliseconds(), Max: timeout.Milliseconds(), Fix: "simplify it (fewer subschemas, shorter patterns), or declare it again when the dispatcher is less busy"}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case compiling <- struct{}{}:
	case <-timer.C:
		return nil, over
	}
	type result struct {
		s   *jsonschema.Schema
		err error
	}
	done := make(chan result, 1)
	go func() {
		defer func() { <-compiling }()
		c := jsonschema.NewCompiler()
		c.UseLoader(refuseLoader{})
		p := &patterns{function: function}
		c.UseRegexpEngine(p.compile)
		url := "toolrelay:///functions/" + function
		err := c.AddResource(url, doc)
		var s *jsonschema.Schema
		if err == nil {
			s, err = c.Compile(url)
		}
		p.compiled.Store(true)
		switch {
		case p.over != nil:
			err = p.over
		case err != nil:
			err = fmt.Errorf("schema of %s: %w", function, notValid(err))
		}
		done <- result{s, err}
	}()
	select {
	case r := <-done:
		return r.s, r.err
	case <-timer.C:
		return nil, over
	}
}

// notValid words a schema the metaschema refuses as "not a valid JSON
// Schema" and the places it fails, without the compiler's own heading
// (the schema's internal address and the metaschema's URL).
func notValid(err error) error {
	var sve *jsonschema.SchemaValidationError
	if !errors.As(err, &sve) || sve.Err == nil {
		return err
	}
	_, places, _ := strings.Cut(sve.Err.Error(), "\n")
	return fmt.Errorf("not a valid JSON Schema:\n%s", strings.Join(leaves(strings.Split(places, "\n")), "\n"))
}

// leaves keeps, of the compiler's tree of failures (each level indented
// by two more spaces: "'allOf' failed" over what failed under it), the
// lines nothing is nested under: where the schema is wrong, and why.
func leaves(tree []string) []string {
	indent := func(l string) int { return len(l) - len(strings.TrimLeft(l, " ")) }
	var out []string
	for i, l := range tree {
		if strings.TrimSpace(l) == "" {
			continue
		}
		if i+1 < len(tree) && indent(tree[i+1]) > indent(l) {
			continue
		}
		out = append(out, strings.TrimLeft(l, " "))
	}
	return out
}

type refuseLoader struct{}

func (refuseLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("references %s: only self-contained schemas are allowed", url)
}

// Check validates arguments and returns a message for the model saying
// what is wrong, or "" when they are valid.
func (s *Schema) Check(args []byte) string {
	if s.text {
		return s.checkText(args)
	}
	kind, detail := s.check(args)
	switch kind {
	case notJSON:
		return fmt.Sprintf("The arguments for %s are not valid JSON (%s). Call it again with a JSON object that matches its parameters.", s.function, detail)
	case longNumber:
		return fmt.Sprintf("The arguments for %s have a number at %s. Round it and call %s again.", s.function, detail, s.function)
	case tooManySteps:
		return fmt.Sprintf("The arguments for %s were not checked: checking them against its parameters would take more than %d steps, the most a call may take (MaxSteps). Call it again with fewer or smaller arguments, or continue without it.",
			s.function, MaxSteps)
	case mismatch:
		return truncate(fmt.Sprintf("The arguments for %s do not match its parameters: %s. Fix them and call it again.", s.function, detail), 2048)
	}
	return ""
}

// Violations validates a JSON document that is not a call's arguments (a
// function's output) and returns what is wrong with it, "at /path: ..."
// for each leaf violation, or "" when it matches.
func (s *Schema) Violations(doc []byte) string {
	kind, detail := s.check(doc)
	switch kind {
	case notJSON:
		return "not valid JSON (" + detail + ")"
	case longNumber:
		return "a number at " + detail
	case tooManySteps:
		return fmt.Sprintf("not checked: checking it would take more than %d steps (MaxSteps)", MaxSteps)
	case mismatch:
		return truncate(detail, 2048)
	}
	return ""
}

// A document's problem, as check finds it.
type problem int

const (
	valid problem = iota
	notJSON
	longNumber
	tooManySteps
	mismatch
)

// check validates doc and says what kind of problem it has, with its
// detail.
func (s *Schema) check(doc []byte) (problem, string) {
	inst, err := decode(doc)
	if err != nil {
		// Described as encoding/json describes it (and taken, should it
		// read what decode does not).
		inst, err = jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	}
	if err != nil {
		return notJSON, err.Error()
	}
	n, err := walkArgs(s.function, inst)
	if err != nil {
		var le *LimitError
		errors.As(err, &le)
		return longNumber, fmt.Sprintf("%s with more digits than a call may carry (%d, over %d)", cmp.Or(le.At, "/"), le.Got, le.Max)
	}
	if s.perValue == 0 || s.perValue*n > MaxSteps {
		c := counter{done: map[countKey]int64{}}
		if c.steps(s.s, newValue(inst)) > MaxSteps {
			return tooManySteps, ""
		}
	}
	if err := s.s.Validate(inst); err != nil {
		msg := err.Error()
		var ve *jsonschema.ValidationError
		if errors.As(err, &ve) {
			msg = describe(ve)
		}
		return mismatch, msg
	}
	return valid, ""
}

var printer = message.NewPrinter(language.English)

// describe lists the leaf violations as "at /path: message".
func describe(ve *jsonschema.ValidationError) string {
	var parts []string
	var walk func(e *jsonschema.ValidationError)
	walk = func(e *jsonschema.ValidationError) {
		if len(e.Causes) == 0 {
			loc := "/" + strings.Join(e.InstanceLocation, "/")
			parts = append(parts, fmt.Sprintf("at %s: %s", loc, e.ErrorKind.LocalizedString(printer)))
			return
		}
		for _, c := range e.Causes {
			walk(c)
		}
	}
	walk(ve)
	return strings.Join(parts, "; ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
