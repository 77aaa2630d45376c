package protocol

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// Tool text within the bounds passes, whatever its language, emoji and
// layout; text over a bound, or holding a character a reviewer would not
// see, is refused with an error naming the bound or the character and
// where it is.
func TestValidateToolText(t *testing.T) {
	schemaWith := func(desc string) string {
		return fmt.Sprintf(`{"type":"object","properties":{"city":{"type":"string","description":%q}}}`, desc)
	}
	tests := []struct {
		name        string
		description string
		parameters  string
		want        string // substring of the error; "" for none
	}{
		{"plain", "Get the weather in a city.", schemaWith("The city, e.g. Seattle"), ""},
		{"languages, emoji and layout", "Wetter für eine Stadt 🌦️ — 天気を調べる.\n\tTabs and lines are fine. 👨\u200d👩\u200d👧 🏳️\u200d🌈",
			schemaWith("Ville, p. ex. Montréal"), ""},
		{"a Persian non-joiner", "می\u200cخواهم", schemaWith("x"), ""},
		{"a Devanagari joiner", "क्\u200dष", schemaWith("x"), ""},
		{"a joiner between Latin letters", "ab\u200dcd", schemaWith("x"), "U+200D at byte 2 is an invisible format character"},
		{"a non-joiner between emoji", "👨\u200c👩", schemaWith("x"), "U+200C"},
		{"a joiner at the end", "👨\u200d", schemaWith("x"), "U+200D"},
		{"emoji with a presentation selector", "Sunny ☀️ or rainy 🌧️", schemaWith("city"), ""},
		{"no schema", "ok", "", ""},
		{"description at the bound", strings.Repeat("a", MaxDescriptionSize), schemaWith("x"), ""},
		{"description over the bound", strings.Repeat("a", MaxDescriptionSize+1), schemaWith("x"),
			"description is 4097 bytes, over the limit of 4096 (MaxDescriptionSize)"},
		{"schema description over the bound", "ok", schemaWith(strings.Repeat("b", MaxSchemaDescriptionSize+1)),
			"/properties/city/description is 1025 bytes, over the limit of 1024 (MaxSchemaDescriptionSize)"},
		{"title over the bound", "ok", `{"type":"object","title":"` + strings.Repeat("t", MaxSchemaTitleSize+1) + `"}`,
			"/title is 257 bytes, over the limit of 256 (MaxSchemaTitleSize)"},
		{"descriptions over the total", strings.Repeat("a", 4000), manyDescriptions(13, 1000), "(MaxToolTextSize)"},
		{"schema over its size", "ok", `{"type":"object","enum":["` + strings.Repeat("e", MaxParametersSize) + `"]}`,
			"(MaxParametersSize)"},
		{"zero-width space", "Get\u200bthe weather", schemaWith("x"), "U+200B at byte 3 is an invisible format character"},
		{"right-to-left override", "Refund \u202Eredro\u202C", schemaWith("x"), "U+202E at byte 7 is a bidirectional control character"},
		{"isolate", "a\u2066b", schemaWith("x"), "U+2066"},
		{"tag characters", "Weather\U000E0049\U000E0067\U000E006E", schemaWith("x"), "U+E0049 at byte 7 is a tag character"},
		{"variation selector smuggling", "Weather\U000E0100", schemaWith("x"), "U+E0100"},
		{"a run of variation selectors", "x\uFE00\uFE01", schemaWith("x"), "U+FE01 at byte 4 is a variation selector that follows no character"},
		{"control character", "bell\a", schemaWith("x"), "U+0007 at byte 4 is a control character"},
		{"carriage return", "line\r\nnext", schemaWith("x"), "U+000D"},
		{"C1 control", "next\u0085line", schemaWith("x"), "U+0085"},
		{"line separator", "a\u2028b", schemaWith("x"), "U+2028"},
		{"byte order mark", "\uFEFFhello", schemaWith("x"), "U+FEFF at byte 0"},
		{"soft hyphen", "in\u00ADvisible", schemaWith("x"), "U+00AD"},
		{"private use", "a\uE000", schemaWith("x"), "U+E000 at byte 1 is a private-use character"},
		{"Hangul filler", "a\u3164b", schemaWith("x"), "U+3164"},
		{"in a parameter description", "ok", schemaWith("city\u200b"), "/properties/city/description: U+200B"},
		{"in a property name", "ok", `{"type":"object","properties":{"ci\u200bty":{"type":"string"}}}`, "/properties/ci\u200bty (a key): U+200B"},
		{"in an enum value", "ok", `{"type":"object","properties":{"unit":{"enum":["c","f\u202e"]}}}`, "/properties/unit/enum/1: U+202E"},
		{"in a default", "ok", `{"type":"object","properties":{"unit":{"default":"\u200d"}}}`, "/properties/unit/default: U+200D"},
		{"escaped in JSON", "ok", `{"type":"object","description":"a\u200bb"}`, "/description: U+200B"},
		{"a property named description", "ok", `{"type":"object","properties":{"description":{"type":"string","description":"what"}}}`, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateToolText("get_weather", tc.description, []byte(tc.parameters))
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("accepted, want an error with %q", tc.want)
			case tc.want != "" && (!strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrToolText)):
				t.Fatalf("error %q: want one wrapping ErrToolText with %q", err, tc.want)
			case err != nil && !strings.Contains(err.Error(), "function get_weather"):
				t.Fatalf("error %q does not name the function", err)
			}
		})
	}
}

// manyDescriptions is a schema with n properties, each described in size
// bytes.
func manyDescriptions(n, size int) string {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"p%d":{"type":"string","description":%q}`, i, strings.Repeat("d", size))
	}
	b.WriteString("}}")
	return b.String()
}

// FuzzValidateToolText: any input is either accepted or refused with
// ErrToolText or ErrMalformed, never a panic; accepted text holds no
// refused rune.
func FuzzValidateToolText(f *testing.F) {
	f.Add("Get the weather.", `{"type":"object"}`)
	f.Add("a\u200bb", `{"description":"x\u202e"}`)
	f.Add("", `[`)
	f.Fuzz(func(t *testing.T, description, parameters string) {
		err := ValidateToolText("f", description, []byte(parameters))
		if err != nil && !errors.Is(err, ErrToolText) && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v wraps neither ErrToolText nor ErrMalformed", err)
		}
		if err == nil {
			for _, r := range description {
				if why := refusedRune(r); why != "" && r != zwj && r != zwnj {
					t.Fatalf("accepted %U (%s)", r, why)
				}
			}
		}
	})
}
