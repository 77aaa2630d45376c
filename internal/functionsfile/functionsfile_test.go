package functionsfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestLoadAcceptsTheExample(t *testing.T) {
	teams, err := Load("../../testdata/functions.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if fns := teams["orders"]; len(fns) != 2 || fns[0].Name != "get_order_status" || fns[0].Timeout.String() != "10s" || fns[0].Concurrency != 4 {
		t.Errorf("orders = %+v", fns)
	}
	if fns := teams["orders"]; len(fns) == 2 && (fns[0].DeferLoading || !fns[1].DeferLoading) {
		t.Errorf("defer_loading: get_order_status %v, get_shipping_eta %v; want false, true", fns[0].DeferLoading, fns[1].DeferLoading)
	}
}

func TestLoadErrorsNameFileAndField(t *testing.T) {
	const ok = "    owner: t\n    command: [\"cat\"]\n"
	tests := map[string]struct {
		body string
		want []string
	}{
		"unknown key":       {"functions:\n  - name: f\n    colour: blue\n" + ok, []string{"colour"}},
		"bad name":          {"functions:\n  - name: a.b\n" + ok, []string{"functions[0]", "name", "a.b"}},
		"duplicate name":    {"functions:\n  - name: f\n" + ok + "  - name: f\n" + ok, []string{"functions[1]", "name", "also declared by functions[0]"}},
		"bad owner":         {"functions:\n  - name: f\n    owner: Bad Team\n    command: [\"cat\"]\n", []string{"owner"}},
		"invalid schema":    {"functions:\n  - name: f\n    parameters: {type: nonsense}\n" + ok, []string{"functions[0] (f)", "parameters"}},
		"bad timeout":       {"functions:\n  - name: f\n    timeout: soon\n" + ok, []string{"timeout", "soon"}},
		"no implementation": {"functions:\n  - name: f\n    owner: t\n", []string{"command", "http"}},
		"both":              {"functions:\n  - name: f\n    http: {url: \"http://x\"}\n" + ok, []string{"not both"}},
		"bad url":           {"functions:\n  - name: f\n    owner: t\n    http: {url: \"ftp://x\"}\n", []string{"http.url"}},
		"missing binary":    {"functions:\n  - name: f\n    owner: t\n    command: [\"no-such-binary-xyz\"]\n", []string{"command", "no-such-binary-xyz"}},
		"empty list":        {"functions: []\n", []string{"empty"}},
		"not an object":     {"functions:\n  - name: f\n    parameters: {type: string}\n" + ok, []string{"parameters", "object", "string"}},
		"bad backoff":       {"functions:\n  - name: f\n    retry: {max_attempts: 3, max_backoff: never}\n" + ok, []string{"retry.max_backoff", "never"}},
		"empty file":        {"", []string{"empty"}},
		"bad defer_loading": {"functions:\n  - name: f\n    defer_loading: sometimes\n" + ok, []string{"sometimes"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := testutil.WriteFile(t, "functions.yaml", tc.body)
			_, err := Load(path)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error does not name the file: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// A relative command path means the same from any working directory: it
// is resolved against the functions file's directory.
func TestRelativeCommandIsResolvedAgainstTheFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "bin", "order-status"), []byte("#!/bin/sh\necho shipped\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "functions.yaml")
	body := "functions:\n  - name: get_order_status\n    owner: orders\n    command: [\"./bin/order-status\"]\n"
	if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Chdir(t.TempDir()) // anywhere but the file's directory
	teams, err := Load(path)
	if err != nil {
		t.Fatalf("Load from another directory: %v", err)
	}
	call := &protocol.Call{Function: "get_order_status", Arguments: []byte("{}"), Deadline: time.Now().Add(time.Minute)}
	out, err := teams["orders"][0].Handler.Handle(t.Context(), &exec.Invocation{Call: call})
	if err != nil || strings.TrimSpace(string(out)) != "shipped" {
		t.Fatalf("ran %q, %v; want the file's ./bin/order-status run", out, err)
	}
}

// A mistyped key is named as the file spells it, with the key it was
// probably meant to be, not as a Go type's field.
func TestTypoSuggestsTheKey(t *testing.T) {
	for body, want := range map[string]string{
		"functions:\n  - name: f\n    paramters: {type: object}\n    owner: t\n    command: [\"cat\"]\n": `line 3: unknown key "paramters" (did you mean "parameters"?)`,
		"functions:\n  - name: f\n    owner: t\n    http: {ulr: \"http://x\"}\n":                         `line 4: unknown key "ulr" (did you mean "url"?)`,
		"function:\n  - name: f\n": `line 1: unknown key "function" (did you mean "functions"?)`,
		"functions:\n  - name: f\n    colour: blue\n    owner: t\n    command: [\"cat\"]\n": `line 3: unknown key "colour" (known keys here: name, description,`,
	} {
		_, err := Load(testutil.WriteFile(t, "functions.yaml", body))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "functionConfig") {
			t.Errorf("error %v; want it to contain %s", err, want)
		}
	}
}

// A schema error says where once, not three times over.
func TestSchemaErrorSaysWhereOnce(t *testing.T) {
	path := testutil.WriteFile(t, "functions.yaml", "functions:\n  - name: f\n    owner: t\n    parameters: {type: nonsense}\n    command: [\"cat\"]\n")
	_, err := Load(path)
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	if n := strings.Count(msg, "parameters"); n != 1 || strings.Contains(msg, "exec: function") || strings.Contains(msg, "toolrelay:///") {
		t.Errorf("error %q: want 'parameters' once and no internal prefixes", msg)
	}
}

// From a new user's first hour: four mistakes took four runs to find.
// Every function's mistake is reported at once, one per line.
func TestEveryFunctionsMistakeIsReportedAtOnce(t *testing.T) {
	path := testutil.WriteFile(t, "functions.yaml", "functions:\n"+
		"  - name: a\n    owner: t\n    parameters: {type: nonsense}\n    command: [\"cat\"]\n"+
		"  - name: b\n    owner: t\n    parameters: {type: object}\n"+
		"  - name: c\n    owner: t\n    parameters: {type: object}\n    command: [\"cat\"]\n"+
		"  - name: c\n    owner: t\n    parameters: {type: object}\n    command: [\"cat\"]\n")
	_, err := Load(path)
	if err == nil {
		t.Fatal("accepted")
	}
	msg := err.Error()
	for _, want := range []string{"functions[0] (a): parameters", "functions[1] (b)", `functions[3] (c): name: "c" is also declared by functions[2]`} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q lacks %q", msg, want)
		}
	}
	if strings.Count(msg, "\n") < 2 {
		t.Errorf("error %q: want one mistake per line", msg)
	}
}

// From a new user's first hour: "requird: [invoice_id]" loaded, and calls
// ran with their arguments unchecked. A key that misspells a JSON Schema
// keyword is refused at its line; property names, and keys far from any
// keyword, are not.
func TestAMisspeltSchemaKeywordIsRefusedAtItsLine(t *testing.T) {
	const head = "functions:\n  - name: get_invoice\n    owner: billing\n    command: [\"cat\"]\n    parameters:\n      type: object\n"
	for name, tc := range map[string]struct{ body, want string }{
		"required": {head + "      properties: {invoice_id: {type: string}}\n      requird: [invoice_id]\n",
			`line 8: parameters: unknown keyword "requird" at /requird (did you mean "required"?)`},
		"properties": {head + "      propertes:\n        invoice_id: {type: string}\n",
			`line 7: parameters: unknown keyword "propertes" at /propertes (did you mean "properties"?)`},
		"in a property": {head + "      properties:\n        invoice_id:\n          tpye: string\n",
			`line 9: parameters: unknown keyword "tpye" at /properties/invoice_id/tpye (did you mean "type"?)`},
		"in anyOf": {head + "      anyOf:\n        - {required: [a]}\n        - {requierd: [b]}\n",
			`line 9: parameters: unknown keyword "requierd" at /anyOf/1/requierd (did you mean "required"?)`},
		"in JSON": {"{\"functions\": [{\"name\": \"f\", \"owner\": \"t\", \"command\": [\"cat\"],\n  \"parameters\": {\"type\": \"object\",\n    \"requird\": []}}]}\n",
			`line 3: parameters: unknown keyword "requird" at /requird (did you mean "required"?)`},
	} {
		t.Run(name, func(t *testing.T) {
			path := testutil.WriteFile(t, "functions.yaml", tc.body)
			_, err := Load(path)
			if err == nil || err.Error() != path+": "+tc.want {
				t.Errorf("error = %v\nwant %s: %s", err, path, tc.want)
			}
		})
	}
	ok := "functions:\n  - name: f\n    owner: t\n    command: [\"cat\"]\n    parameters:\n      type: object\n" +
		"      properties: {requird: {type: string}, tpye: {type: string}}\n      x-colour: blue\n      example: {requird: x}\n"
	if _, err := Load(testutil.WriteFile(t, "functions.yaml", ok)); err != nil {
		t.Errorf("a schema with property names near keywords: %v", err)
	}
}

// From a new user's first hour: shape mistakes gave the decoder's
// "cannot unmarshal !!seq into map[string]interface {}". The error names
// the key, what was given and what is wanted, with an example.
func TestAValueOfTheWrongShapeIsExplained(t *testing.T) {
	const head = "functions:\n  - name: get_invoice\n    owner: billing\n"
	for name, tc := range map[string]struct{ body, want string }{
		"parameters as a list": {head + "    command: [\"cat\"]\n    parameters: [order_id]\n",
			`line 5: parameters: a list was given; parameters is a JSON Schema, a mapping, e.g. parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}`},
		"parameters as a string": {head + "    command: [\"cat\"]\n    parameters: \"order_id\"\n",
			`line 5: parameters: a string ("order_id") was given; parameters is a JSON Schema, a mapping, e.g. parameters: {type: object, properties: {order_id: {type: string}}, required: [order_id]}`},
		"command as a string": {head + "    command: \"./scripts/invoice.sh\"\n",
			`line 4: command: a string ("./scripts/invoice.sh") was given; command is a list, e.g. command: [./scripts/invoice.sh]`},
		"command with arguments": {head + "    command: python3 scripts/invoice.py\n",
			`line 4: command: a string ("python3 scripts/invoice.py") was given; command is a list, e.g. command: [python3, scripts/invoice.py]`},
		"http as a string": {head + "    http: \"http://localhost:9000/invoice\"\n",
			`line 4: http: a string ("http://localhost:9000/invoice") was given; http is a mapping with the keys url, e.g. http: {url: ...}`},
		"concurrency as a word": {head + "    command: [\"cat\"]\n    concurrency: four\n",
			`line 5: concurrency: a string ("four") was given; concurrency is a whole number`},
	} {
		t.Run(name, func(t *testing.T) {
			path := testutil.WriteFile(t, "functions.yaml", tc.body)
			_, err := Load(path)
			if err == nil || err.Error() != path+": "+tc.want {
				t.Errorf("error = %v\nwant %s: %s", err, path, tc.want)
			}
		})
	}
}
