package protocol

import (
	"fmt"
	"regexp"
)

// A function may take free-form text instead of JSON arguments: a custom
// tool, in the Responses API's terms ({"type":"custom","name":...,
// "format":...}). Its spec carries Format instead of Parameters; its calls
// carry the model's raw input as a JSON string in Call.Arguments, marked
// with Call.Format = FormatText; and the dispatcher answers the platform
// with a custom_tool_call_output.

// Input formats and grammar syntaxes of a custom tool.
const (
	// FormatText is unconstrained text.
	FormatText = "text"
	// FormatGrammar is text a grammar (Syntax, Definition) constrains.
	FormatGrammar = "grammar"
	// SyntaxLark is a Lark grammar: the platform constrains the model's
	// output with it; toolrelay does not check it.
	SyntaxLark = "lark"
	// SyntaxRegex is a regular expression the whole input must match;
	// the dispatcher checks it before a call goes out.
	SyntaxRegex = "regex"
)

// MaxGrammarSize bounds a grammar's definition.
const MaxGrammarSize = 64 << 10

// InputFormat is the input of a custom tool: free text, or text a grammar
// constrains.
type InputFormat struct {
	// Type is FormatText or FormatGrammar.
	Type string `json:"type"`
	// Syntax is SyntaxLark or SyntaxRegex, for a grammar.
	Syntax string `json:"syntax,omitempty"`
	// Definition is the grammar.
	Definition string `json:"definition,omitempty"`
}

// Validate reports whether f is complete; a regex grammar must compile
// as RE2 syntax (Go's regexp), which the dispatcher checks inputs with.
func (f *InputFormat) Validate(function string) error {
	switch f.Type {
	case FormatText:
		if f.Syntax != "" || f.Definition != "" {
			return fmt.Errorf("%w: function %s: format text takes no grammar", ErrMalformed, function)
		}
		return nil
	case FormatGrammar:
	default:
		return fmt.Errorf("%w: function %s: format type %q: want %q or %q", ErrMalformed, function, f.Type, FormatText, FormatGrammar)
	}
	if f.Definition == "" || len(f.Definition) > MaxGrammarSize {
		return fmt.Errorf("%w: function %s: a grammar needs a definition of 1 to %d bytes", ErrMalformed, function, MaxGrammarSize)
	}
	switch f.Syntax {
	case SyntaxLark:
		return nil
	case SyntaxRegex:
		if _, err := CompileGrammarRegex(f.Definition); err != nil {
			return fmt.Errorf("%w: function %s: regex grammar: %w", ErrMalformed, function, err)
		}
		return nil
	}
	return fmt.Errorf("%w: function %s: grammar syntax %q: want %q or %q", ErrMalformed, function, f.Syntax, SyntaxLark, SyntaxRegex)
}

// Regex returns a regex grammar compiled to match a whole input, and nil
// for any other format.
func (f *InputFormat) Regex() (*regexp.Regexp, error) {
	if f == nil || f.Type != FormatGrammar || f.Syntax != SyntaxRegex {
		return nil, nil
	}
	return CompileGrammarRegex(f.Definition)
}

// CompileGrammarRegex compiles a regex grammar so that it matches a whole
// input, not a part of it.
func CompileGrammarRegex(definition string) (*regexp.Regexp, error) {
	return regexp.Compile(`\A(?:` + definition + `)\z`)
}
