package main

import (
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolrelay/toolrelay/internal/apiauth"
)

// "dispatcher token" prints a token on stdout and appends its hashed line
// to the file, which then authenticates the token with its scope.
func TestTokenCommandAddsAHashedLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(path, []byte("# API tokens"), 0o600); err != nil { // no final newline
		t.Fatal(err)
	}
	var tokens []string
	for _, args := range [][]string{
		{"token", "-name", "ops", "-admin", "-file", path},
		{"token", "-name", "orders-ci", "-teams", "orders,billing", "-file", path},
		{"token", "-name", "support-bot", "-tools", "orders", "-file", path},
	} {
		var out, errOut bytes.Buffer
		if err := run(t.Context(), args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v\n%s", args, err, errOut.String())
		}
		tok := strings.TrimSpace(out.String())
		if !strings.HasPrefix(tok, apiauth.TokenPrefix) || strings.Contains(tok, "\n") {
			t.Fatalf("%v printed %q; want the token alone", args, out.String())
		}
		tokens = append(tokens, tok)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tok := range tokens {
		if strings.Contains(string(b), tok) {
			t.Errorf("the file holds a token:\n%s", b)
		}
	}
	f, err := apiauth.Open(path, apiauth.Options{})
	if err != nil {
		t.Fatalf("the file made by the command: %v\n%s", err, b)
	}
	if c, ok := f.Authenticate(tokens[0]); !ok || !c.Admin || c.Name != "ops" {
		t.Errorf("admin token: %+v %v", c, ok)
	}
	if c, ok := f.Authenticate(tokens[1]); !ok || c.Admin || c.ToolsOnly || strings.Join(c.Teams, ",") != "orders,billing" {
		t.Errorf("team token: %+v %v", c, ok)
	}
	if c, ok := f.Authenticate(tokens[2]); !ok || c.Admin || !c.ToolsOnly || strings.Join(c.Teams, ",") != "orders" {
		t.Errorf("tools token: %+v %v", c, ok)
	}

	for _, args := range [][]string{
		{"token", "-name", "ops", "-admin", "-file", path},    // the name is taken
		{"token", "-name", "x"},                               // no scope
		{"token", "-name", "x", "-admin", "-teams", "a"},      // both
		{"token", "-name", "x", "-teams", "a", "-tools", "a"}, // both
		{"token", "-admin"},                                   // no name
		{"token", "-name", "x", "-teams", "Orders"},           // not a team name
	} {
		var out, errOut bytes.Buffer
		if err := run(t.Context(), args, &out, &errOut); err == nil || out.Len() > 0 {
			t.Errorf("%v: %v, printed %q; want an error and no token", args, err, out.String())
		}
	}
	if after, _ := os.ReadFile(path); !bytes.Equal(after, b) {
		t.Errorf("refused commands changed the file:\n%s", after)
	}
}

// A malformed tokens file stops the service at startup, naming file and line.
func TestServeRefusesAMalformedTokensFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens.txt")
	if err := os.WriteFile(path, []byte("# tokens\nops admin not-a-hash\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("TOOLRELAY_API_TOKENS_FILE", path)
	var out, errOut bytes.Buffer
	err := run(t.Context(), []string{"serve"}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), path+":2:") {
		t.Fatalf("serve with a malformed tokens file: %v; want an error naming %s:2", err, path)
	}
}

// The built dispatcher with a tokens file wants a bearer token on /v1 and
// none on /readyz; without one it says it serves loopback clients only.
func TestBuiltDispatcherWithATokensFile(t *testing.T) {
	w := newWorld(t)
	path := filepath.Join(w.dir, "tokens.txt")
	var out, errOut bytes.Buffer
	if err := run(t.Context(), []string{"token", "-name", "ops", "-admin", "-file", path}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(out.String())
	d := w.dispatcher("guarded", "TOOLRELAY_API_TOKENS_FILE="+path) // ready: /readyz is open
	get := func(tok string) int {
		req, _ := http.NewRequest(http.MethodGet, "http://"+d.addr+"/v1/watch/w_nope", nil)
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := get(""); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	if code := get(string(apiauth.NewToken())); code != http.StatusUnauthorized {
		t.Errorf("unknown token: %d, want 401", code)
	}
	if code := get(token); code != http.StatusNotFound {
		t.Errorf("admin token: %d, want 404 (let through; no such watch)", code)
	}
	w.dispatcher("open")
	b, _ := os.ReadFile(filepath.Join(w.dir, "open.log"))
	if !strings.Contains(string(b), "loopback clients only") {
		t.Errorf("a dispatcher without tokens does not say it serves loopback clients only:\n%s", tail(string(b), 2000))
	}
	b, _ = os.ReadFile(filepath.Join(w.dir, "guarded.log"))
	if strings.Contains(string(b), token) || !strings.Contains(string(b), "needs a bearer token") {
		t.Errorf("the guarded dispatcher's log leaks the token or does not say /v1 needs one:\n%s", tail(string(b), 2000))
	}
}
