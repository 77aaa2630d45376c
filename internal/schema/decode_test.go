package schema

import (
	"bytes"
	"reflect"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// sameAsValidator checks that decode reads data as the validator's own
// decoder does: the same value, or a refusal where that one refuses.
func sameAsValidator(t *testing.T, data []byte) {
	t.Helper()
	want, werr := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	got, err := decode(data)
	switch {
	case werr != nil && err == nil:
		t.Fatalf("decode(%q) = %#v; encoding/json refuses it: %v", data, got, werr)
	case werr == nil && err != nil:
		t.Fatalf("decode(%q) refused it; encoding/json reads %#v", data, want)
	case werr == nil && !reflect.DeepEqual(got, want):
		t.Fatalf("decode(%q) = %#v, encoding/json reads %#v", data, got, want)
	}
}

var decodeSeeds = []string{
	`{}`, `[]`, `{"a":1}`, ` {"a" : [1, -2.5e+3, 0, -0, 1E9, true, false, null, "x"]} `,
	`{"a":{"b":{"c":[[],{}]}}}`, `{"a":1,"a":2}`, `"plain"`, `12345678901234567890123`,
	`"\u00e9\n\t\"\\/"`, `"caf\u00e9 and café"`, `"\ud83d\ude00"`, `"\ud800"`, "\"\xff\xfe\"",
	`01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `tru`, `nul`, `truex`, `[1,]`, `{"a":1,}`,
	`{"a"}`, `{a:1}`, `[1 2]`, `{"a":1}{"b":2}`, `{"a":1} x`, `"\x01"`, "\"a\x00b\"",
	`"\q"`, `"\u12"`, `"abc`, `[`, `{`, `{"a":`, ``, `   `, "\ufeff{}", `NaN`, `[-]`,
	`{"a":1}` + "\n", `[1,2,3` + strings.Repeat(" ", 3) + `]`,
}

func TestDecodeReadsAsTheValidatorDoes(t *testing.T) {
	for _, s := range decodeSeeds {
		sameAsValidator(t, []byte(s))
	}
	// Nesting up to encoding/json's limit is read; one deeper is refused
	// by both.
	for _, n := range []int{maxDepth, maxDepth + 1} {
		sameAsValidator(t, []byte(strings.Repeat("[", n)+strings.Repeat("]", n)))
		sameAsValidator(t, []byte(strings.Repeat(`{"a":`, n)+"1"+strings.Repeat("}", n)))
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range decodeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(sameAsValidator)
}

// A check reads arguments through decode; what it says of malformed ones
// is what encoding/json says.
func TestCheckDescribesMalformedArgumentsAsEncodingJSONDoes(t *testing.T) {
	s, err := Compile("f", []byte(`{"type":"object","properties":{"n":{"type":"integer"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if msg := s.Check([]byte(`{"n":1}`)); msg != "" {
		t.Fatalf("valid arguments refused: %s", msg)
	}
	if msg := s.Check([]byte(`{"n":1.5}`)); !strings.Contains(msg, "do not match") {
		t.Fatalf("a non-integer passed: %q", msg)
	}
	msg := s.Check([]byte(`{"n":1,}`))
	if !strings.Contains(msg, "not valid JSON (invalid character '}' looking for beginning of object key string)") {
		t.Fatalf("malformed arguments described as %q", msg)
	}
}
