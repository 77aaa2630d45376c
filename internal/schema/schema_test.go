package schema

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	s, err := Compile("get_weather", []byte(`{"type":"object","properties":{"location":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["location"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		args string
		want []string // substrings of the message; nil means valid
	}{
		{`{"location":"Paris"}`, nil},
		{`{"location":"Paris","unit":"c"}`, nil},
		{`{}`, []string{"get_weather", "missing property", "location"}},
		{`{"location":3}`, []string{"at /location", "string"}},
		{`{"location":"x","unit":"k"}`, []string{"at /unit"}},
		{`{"location":"x","extra":1}`, []string{"extra"}},
		{`not json`, []string{"not valid JSON"}},
		{`[]`, []string{"object"}},
	}
	for _, tc := range tests {
		got := s.Check([]byte(tc.args))
		if tc.want == nil {
			if got != "" {
				t.Errorf("Check(%s) = %q, want valid", tc.args, got)
			}
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("Check(%s) = %q, want it to mention %q", tc.args, got, w)
			}
		}
	}
}

func TestCompileRejects(t *testing.T) {
	for name, raw := range map[string]string{
		"not json":      `{`,
		"not an object": `"string"`,
		"bad keyword":   `{"type":"nonsense"}`,
		"remote ref":    `{"$ref":"https://example.com/schema.json"}`,
		"file ref":      `{"$ref":"file:///etc/passwd"}`,
	} {
		if _, err := Compile("f", []byte(raw)); err == nil {
			t.Errorf("%s: Compile accepted %s", name, raw)
		}
	}
}

// Schemas the validator tells apart get different digests: a call checked
// against one must not pass for having been checked against the other.
func TestDigestTellsApartWhatTheValidatorDoes(t *testing.T) {
	a, b := []byte(`{"type":"integer","maximum":9007199254740993}`), []byte(`{"type":"integer","maximum":9007199254740992}`)
	if Digest(a) == Digest(b) {
		t.Error("two maximums the validator tells apart share a digest")
	}
	if Digest([]byte(`{"type":"object", "required":["x"]}`)) != Digest([]byte(`{"required":["x"],"type":"object"}`)) {
		t.Error("key order and spacing changed the digest")
	}
}

// A schema the metaschema refuses reads "schema of f: not a valid JSON
// Schema:" and where, naming the function once and none of the compiler's
// internals.
func TestCompileNamesAnInvalidSchemaOnce(t *testing.T) {
	_, err := Compile("roll_dice", []byte(`{"type":"object","properties":{"sides":{"type":"intger"}}}`))
	if err == nil {
		t.Fatal("Compile accepted a type that does not exist")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "schema of roll_dice: not a valid JSON Schema:\n") || !strings.Contains(msg, "/properties/sides/type") {
		t.Errorf("error %q: want it to start with the function and say where", msg)
	}
	// Only where it is wrong and why: not the metaschema's 'allOf' and
	// 'anyOf' over them (a new user's first hour read a five-line tree).
	for _, internal := range []string{"toolrelay:///", "metaschema", "jsonschema validation failed", "'allOf' failed", "'anyOf' failed"} {
		if strings.Contains(msg, internal) {
			t.Errorf("error %q mentions %q", msg, internal)
		}
	}
	if n := strings.Count(msg, "roll_dice"); n != 1 {
		t.Errorf("error %q names the function %d times, want once", msg, n)
	}
}
