package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Tool text is what a team writes that an agent's model reads as
// instructions: a function's description, and every string of its
// parameters' JSON Schema (descriptions, titles, property names, enum
// values, defaults, examples). One team's words reach the model of every
// agent given its tools, beside other teams' tools, so they are an
// instruction channel from any team into every such agent ("tool
// poisoning"). toolrelay bounds how much a team can say there and refuses
// characters a person reviewing the text would not see.
//
// The executor library checks these bounds when a function is registered;
// the dispatchers check them again on every declaration (an executor need
// not be ours) and refuse one that breaks them, naming the bound.
const (
	// MaxDescriptionSize bounds a function's description, in bytes.
	MaxDescriptionSize = 4 << 10
	// MaxSchemaDescriptionSize bounds each "description" string in the
	// parameters' schema, in bytes.
	MaxSchemaDescriptionSize = 1 << 10
	// MaxSchemaTitleSize bounds each "title" string in the parameters'
	// schema, in bytes.
	MaxSchemaTitleSize = 256
	// MaxToolTextSize bounds a function's description and all of its
	// schema's descriptions and titles together, in bytes.
	MaxToolTextSize = 16 << 10
	// MaxParametersSize bounds the parameters' schema as declared, in
	// bytes: it bounds every other string in it (enum values, defaults,
	// examples, property names). The output schema has the same bound.
	MaxParametersSize = 64 << 10
	// MaxTitleSize bounds a function's title, in bytes.
	MaxTitleSize = 256
)

// ErrToolText is wrapped by every error about a function's tool text: a
// bound above exceeded, or a character refused (see ValidateToolText).
var ErrToolText = errors.New("protocol: tool text refused")

// ValidateToolText checks the tool text of function: its description and
// the strings of its parameters' schema. It refuses text over the bounds
// above and, anywhere in that text, characters that do not show or that
// change how the text around them shows:
//
//   - control characters (C0, DEL, C1) other than tab and line feed;
//   - invisible format characters (Unicode category Cf): zero-width
//     space, word joiner, soft hyphen, byte order mark, invisible
//     operators, zero-width joiners and non-joiners except between two
//     letters of a script they shape (not Latin) or, for the joiner,
//     between two pictographs (emoji sequences), and the bidirectional
//     marks, embeddings,
//     overrides and isolates (U+200E, U+200F, U+202A-U+202E, U+2066-U+2069,
//     U+061C), which can make text read differently from how it is stored;
//   - tag characters (U+E0000-U+E007F), which spell out hidden ASCII;
//   - line and paragraph separators (U+2028, U+2029);
//   - private-use and unassigned code points, and Hangul fillers;
//   - variation selectors U+E0100-U+E01EF, and any variation selector that
//     follows another (a run of them hides bytes; one after a character
//     picks its glyph, as emoji do).
//
// The error wraps ErrToolText and names the function, where the text is (a
// JSON Pointer into the parameters) and the bound or the character.
func ValidateToolText(function, description string, parameters []byte) error {
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: function %s: %s", ErrToolText, function, fmt.Sprintf(format, args...))
	}
	if n := len(description); n > MaxDescriptionSize {
		return refuse("description is %d bytes, over the limit of %d (MaxDescriptionSize)", n, MaxDescriptionSize)
	}
	if err := checkRunes(description); err != nil {
		return refuse("description: %v", err)
	}
	if n := len(parameters); n > MaxParametersSize {
		return refuse("parameters schema is %d bytes, over the limit of %d (MaxParametersSize)", n, MaxParametersSize)
	}
	if len(bytes.TrimSpace(parameters)) == 0 {
		return nil // no schema: Validate says whether that is allowed
	}
	// Decoding would read invalid UTF-8 as U+FFFD, but the schema is
	// stored and handed on as declared.
	if !utf8.Valid(parameters) {
		i := 0
		for r, n := utf8.DecodeRune(parameters); r != utf8.RuneError || n != 1; r, n = utf8.DecodeRune(parameters[i:]) {
			i += n
		}
		return refuse("parameters schema is not valid UTF-8 (at byte %d)", i)
	}
	dec := json.NewDecoder(bytes.NewReader(parameters))
	dec.UseNumber()
	var schema any
	if err := dec.Decode(&schema); err != nil {
		return fmt.Errorf("%w: function %s: parameters must be a JSON Schema object: %w", ErrMalformed, function, err)
	}
	w := textWalk{total: len(description)}
	if err := w.walk(schema, ""); err != nil {
		return refuse("parameters %s", err)
	}
	if w.total > MaxToolTextSize {
		return refuse("description and schema descriptions and titles are %d bytes together, over the limit of %d (MaxToolTextSize)",
			w.total, MaxToolTextSize)
	}
	return nil
}

// ValidateToolText checks s's tool text: its description and parameters
// (see the function ValidateToolText), and its title and output schema,
// under the same rules; the output schema's descriptions and titles have a
// MaxToolTextSize of their own.
func (s *FunctionSpec) ValidateToolText() error {
	if err := ValidateToolText(s.Name, s.Description, s.Parameters); err != nil {
		return err
	}
	refuse := func(format string, args ...any) error {
		return fmt.Errorf("%w: function %s: %s", ErrToolText, s.Name, fmt.Sprintf(format, args...))
	}
	if n := len(s.Title); n > MaxTitleSize {
		return refuse("title is %d bytes, over the limit of %d (MaxTitleSize)", n, MaxTitleSize)
	}
	if err := checkRunes(s.Title); err != nil {
		return refuse("title: %v", err)
	}
	if len(bytes.TrimSpace(s.OutputSchema)) == 0 {
		return nil
	}
	if n := len(s.OutputSchema); n > MaxParametersSize {
		return refuse("output schema is %d bytes, over the limit of %d (MaxParametersSize)", n, MaxParametersSize)
	}
	if !utf8.Valid(s.OutputSchema) {
		return refuse("output schema is not valid UTF-8")
	}
	dec := json.NewDecoder(bytes.NewReader(s.OutputSchema))
	dec.UseNumber()
	var schema any
	if err := dec.Decode(&schema); err != nil {
		return fmt.Errorf("%w: function %s: output_schema must be a JSON Schema object: %w", ErrMalformed, s.Name, err)
	}
	var w textWalk
	if err := w.walk(schema, ""); err != nil {
		return refuse("output schema %s", err)
	}
	if w.total > MaxToolTextSize {
		return refuse("output schema descriptions and titles are %d bytes together, over the limit of %d (MaxToolTextSize)", w.total, MaxToolTextSize)
	}
	return nil
}

// textWalk checks every string of a decoded schema, adding the sizes of
// its descriptions and titles to total.
type textWalk struct{ total int }

func (w *textWalk) walk(v any, at string) error {
	switch v := v.(type) {
	case string:
		if err := checkRunes(v); err != nil {
			return fmt.Errorf("%s: %w", pointer(at), err)
		}
	case []any:
		for i, e := range v {
			if err := w.walk(e, fmt.Sprintf("%s/%d", at, i)); err != nil {
				return err
			}
		}
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys) // the same error for the same schema
		for _, k := range keys {
			here := at + "/" + pointerEscaper.Replace(k)
			if err := checkRunes(k); err != nil {
				return fmt.Errorf("%s (a key): %w", pointer(here), err)
			}
			if s, ok := v[k].(string); ok {
				limit, name := 0, ""
				switch k {
				case "description":
					limit, name = MaxSchemaDescriptionSize, "MaxSchemaDescriptionSize"
				case "title":
					limit, name = MaxSchemaTitleSize, "MaxSchemaTitleSize"
				}
				if limit > 0 {
					if len(s) > limit {
						return fmt.Errorf("%s is %d bytes, over the limit of %d (%s)", pointer(here), len(s), limit, name)
					}
					w.total += len(s)
				}
			}
			if err := w.walk(v[k], here); err != nil {
				return err
			}
		}
	}
	return nil
}

// pointer shows a JSON Pointer into the parameters; "" is the whole schema.
func pointer(at string) string {
	if at == "" {
		return "(the schema itself)"
	}
	return at
}

// checkRunes returns why s holds a character tool text must not, or nil.
func checkRunes(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	prev := rune(-1)
	for i, r := range s {
		why := refusedRune(r)
		switch {
		case r == zwj || r == zwnj:
			next, size := utf8.DecodeRuneInString(s[i+utf8.RuneLen(r):])
			if size > 0 && joins(prev, r, next) {
				why = ""
			}
		case why == "" && unicode.Is(unicode.Variation_Selector, r) && (prev < 0 || unicode.Is(unicode.Variation_Selector, prev)):
			why = "a variation selector that follows no character"
		}
		if why != "" {
			return fmt.Errorf("%U at byte %d is %s; such characters are refused in tool text", r, i, why)
		}
		prev = r
	}
	return nil
}

const (
	zwj  = '\u200D' // zero-width joiner
	zwnj = '\u200C' // zero-width non-joiner
)

// joins reports whether joiner (ZWJ or ZWNJ) between prev and next does
// what writing needs it for, and so shows: shaping two letters of a script
// that joins or conjoins them (Arabic, Persian, Indic scripts: not Latin,
// where it does nothing visible), or, for ZWJ, making one emoji of two.
func joins(prev, joiner, next rune) bool {
	letter := func(r rune) bool {
		return unicode.In(r, unicode.L, unicode.M) && !unicode.Is(unicode.Latin, r) && r >= 0x80
	}
	if letter(prev) && letter(next) {
		return true
	}
	pictograph := func(r rune) bool { return unicode.In(r, unicode.So, unicode.Sk) }
	return joiner == zwj && (pictograph(prev) || prev == '\uFE0F') && pictograph(next)
}

// refusedRune says why r is refused in tool text, or "" if it is not.
func refusedRune(r rune) string {
	switch {
	case r == '\t' || r == '\n':
		return ""
	case unicode.IsControl(r):
		return "a control character"
	case r == 0x061C || r == 0x200E || r == 0x200F || 0x202A <= r && r <= 0x202E || 0x2066 <= r && r <= 0x2069:
		return "a bidirectional control character (it reorders the text around it)"
	case 0xE0000 <= r && r <= 0xE007F:
		return "a tag character (invisible)"
	case 0xE0100 <= r && r <= 0xE01EF:
		return "a supplementary variation selector (invisible)"
	case unicode.Is(unicode.Cf, r):
		return "an invisible format character"
	case r == 0x2028 || r == 0x2029:
		return "a line or paragraph separator"
	case r == 0x115F || r == 0x1160 || r == 0x3164 || r == 0xFFA0:
		return "a Hangul filler (invisible)"
	case unicode.Is(unicode.Co, r):
		return "a private-use character"
	case !unicode.In(r, unicode.L, unicode.M, unicode.N, unicode.P, unicode.S, unicode.Zs):
		return "an unassigned code point"
	}
	return ""
}

// pointerEscaper escapes a key as a JSON Pointer token (RFC 6901).
var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")
