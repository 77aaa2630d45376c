package schema

import (
	"encoding/json"
	"fmt"
	"regexp"
)

// CompileText returns the checker of a custom tool's input, taken in
// place of a parameter schema: the arguments must be a JSON string (the
// model's raw text) and, with re (a compiled regex grammar, anchored at
// both ends), match it. source identifies the format, for Digest: give the
// format's JSON.
func CompileText(function string, source []byte, re *regexp.Regexp) *Schema {
	return &Schema{function: function, digest: Digest(source), text: true, grammar: re}
}

// checkText is Check for a custom tool's input.
func (s *Schema) checkText(args []byte) string {
	var input string
	if json.Unmarshal(args, &input) != nil {
		return fmt.Sprintf("%s takes free-form text, not JSON arguments. Call it again with its input as text.", s.function)
	}
	if s.grammar != nil && !s.grammar.MatchString(input) {
		return truncate(fmt.Sprintf("The input for %s does not match its grammar (the regular expression %s). Fix it and call it again.",
			s.function, s.grammar.String()), 2048)
	}
	return ""
}
