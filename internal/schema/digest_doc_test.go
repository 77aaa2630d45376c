package schema

import (
	"bytes"
	"encoding/json"
	"os"
	"regexp"
	"testing"
)

// TestDigestExampleInProtocolDoc recomputes the worked example of
// docs/protocol.md, "The schema digest": the declared bytes, their
// canonical form and the digest, so the document cannot drift from the
// digest the dispatcher and pkg/exec compute.
func TestDigestExampleInProtocolDoc(t *testing.T) {
	doc, err := os.ReadFile("../../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	block := func(name string) []byte {
		t.Helper()
		m := regexp.MustCompile("(?s)<!-- digest " + name + " -->\n```[a-z]*\n(.*?)```\n<!-- end -->").FindSubmatch(doc)
		if m == nil {
			t.Fatalf("docs/protocol.md has no digest %s block", name)
		}
		return m[1]
	}
	input := block("input")
	canonical := bytes.TrimSuffix(block("canonical"), []byte("\n"))
	digest := string(bytes.TrimSpace(block("value")))

	var v any
	dec := json.NewDecoder(bytes.NewReader(input))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	got, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, canonical) {
		t.Errorf("canonical form:\n got %s\nwant %s (the doc)", got, canonical)
	}
	if got := Digest(input); got != digest {
		t.Errorf("Digest = %s, the doc says %s", got, digest)
	}
	// The escapes the doc lists, one by one.
	for in, want := range map[string]string{
		`"<>&"`: `"\u003c\u003e\u0026"`, `"\u00e9"`: `"é"`, "\"\u2028\"": `"\u2028"`, `"\/"`: `"/"`,
		`"\b\f\n\r\t\u0001"`: `"\b\f\n\r\t\u0001"`, `1.50`: `1.50`, `-0`: `-0`, `1E+2`: `1E+2`,
	} {
		var v any
		dec := json.NewDecoder(bytes.NewReader([]byte(in)))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Fatal(in, err)
		}
		if got, _ := json.Marshal(v); string(got) != want {
			t.Errorf("canonical form of %s = %s, the doc says %s", in, got, want)
		}
	}
}
