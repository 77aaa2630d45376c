package apiauth_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// line is the tokens file line of a new token, which it returns too.
func line(t *testing.T, name string, admin bool, teams ...string) (string, apiauth.Token) {
	t.Helper()
	tok := apiauth.NewToken()
	e, err := apiauth.NewEntry(name, admin, teams, tok)
	if err != nil {
		t.Fatal(err)
	}
	return e.String(), tok
}

// write replaces the file at path with content, whole (by a rename), as
// the docs advise, so Run never sees it half-written.
func write(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

func TestEntryLineParsesBack(t *testing.T) {
	admin, adminTok := line(t, "ops", true)
	team, teamTok := line(t, "orders-ci", false, "orders", "billing")
	toolsTok := apiauth.NewToken()
	tools, err := apiauth.NewToolsEntry("support-bot", []string{"orders"}, toolsTok)
	if err != nil {
		t.Fatal(err)
	}
	content := "# toolrelay API tokens\n\n" + admin + "\n   \t" + team + "  \n" + tools.String() + "\n"
	entries, err := apiauth.Parse("tokens", []byte(content))
	if err != nil {
		t.Fatal(err)
	}
	want := []apiauth.Entry{
		{Name: "ops", Admin: true, Hash: apiauth.Hash(adminTok)},
		{Name: "orders-ci", Teams: []string{"orders", "billing"}, Hash: apiauth.Hash(teamTok)},
		{Name: "support-bot", Teams: []string{"orders"}, ToolsOnly: true, Hash: apiauth.Hash(toolsTok)},
	}
	if !strings.Contains(tools.String(), " tools:orders ") {
		t.Errorf("tools-only line %q: want the scope tools:orders", tools)
	}
	if got := entries[2].Caller(); !got.ToolsOnly || got.Admin || !got.Sees("orders") || got.Sees("billing") {
		t.Errorf("tools-only caller %+v: want ToolsOnly, seeing orders only", got)
	}
	if diff := cmp.Diff(want, entries); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	if strings.Contains(content, string(adminTok)) || strings.Contains(content, string(teamTok)) {
		t.Error("a line holds the token itself")
	}
}

func TestNewTokensDiffer(t *testing.T) {
	a, b := apiauth.NewToken(), apiauth.NewToken()
	if a == b || !strings.HasPrefix(string(a), apiauth.TokenPrefix) || len(a) < 40 {
		t.Errorf("tokens %d and %d bytes long, equal: %v; want two distinct random tokens", len(a), len(b), a == b)
	}
}

// A token never shows in logs or formatted output.
func TestTokenIsRedacted(t *testing.T) {
	tok := apiauth.NewToken()
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("made", "token", tok)
	out := buf.String() + fmt.Sprint(tok) + fmt.Sprintf("%v %s %#v", tok, tok, tok)
	if strings.Contains(out, string(tok)) || !strings.Contains(out, "REDACTED") {
		t.Errorf("the token shows: %s", out)
	}
}

func TestParseErrorsNameFileAndLine(t *testing.T) {
	good, tok := line(t, "ops", true)
	hash := apiauth.Hash(tok)
	cases := []struct {
		name, content, want string
	}{
		{"too few fields", "ops admin", "tokens.txt:1: want 3 fields"},
		{"unknown scope", "# c\nops root " + hash, "tokens.txt:2: the scope"},
		{"empty team list", "ops teams: " + hash, "tokens.txt:1: scope: team name"},
		{"empty tools list", "ops tools: " + hash, "tokens.txt:1: scope: team name"},
		{"bad team name", "ops teams:Orders " + hash, `team name "Orders"`},
		{"short hash", "ops admin sha256:abc", "tokens.txt:1: the third field"},
		{"upper-case hash", "ops admin " + strings.ToUpper(hash), "tokens.txt:1: the third field"},
		{"a token instead of its hash", "ops admin " + string(tok), "tokens.txt:1: the third field is a token, not its hash"},
		{"duplicate name", good + "\nops teams:orders sha256:" + strings.Repeat("0", 64), "tokens.txt:2: name ops is already used on line 1"},
		{"duplicate hash", good + "\nci teams:orders " + hash, "tokens.txt:2: the same token hash is already on line 1"},
		{"bad name", "o/ps admin " + hash, "tokens.txt:1: name may hold"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := apiauth.Parse("tokens.txt", []byte(tc.content))
			if err == nil || !errors.Is(err, apiauth.ErrMalformed) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v; want one wrapping ErrMalformed containing %q", err, tc.want)
			}
			if strings.Contains(err.Error(), string(tok)) {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

func TestOpenAuthenticatesByScope(t *testing.T) {
	admin, adminTok := line(t, "ops", true)
	team, teamTok := line(t, "orders-ci", false, "orders")
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, admin+"\n"+team+"\n")
	f, err := apiauth.Open(path, apiauth.Options{Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if f.Len() != 2 {
		t.Fatalf("%d tokens, want 2", f.Len())
	}
	cases := []struct {
		token  string
		want   dispatch.Caller
		wantOK bool
	}{
		{string(adminTok), dispatch.Caller{Name: "ops", Admin: true}, true},
		{string(teamTok), dispatch.Caller{Name: "orders-ci", Teams: []string{"orders"}}, true},
		{string(apiauth.NewToken()), dispatch.Caller{}, false},
		{"", dispatch.Caller{}, false},
		{apiauth.Hash(adminTok), dispatch.Caller{}, false}, // the hash is no token
	}
	for i, tc := range cases {
		got, ok := f.Authenticate(tc.token)
		if ok != tc.wantOK || !cmp.Equal(got, tc.want) {
			t.Errorf("case %d: %+v %v; want %+v %v", i, got, ok, tc.want, tc.wantOK)
		}
	}
}

func TestOpenRefusesMissingAndMalformedFiles(t *testing.T) {
	dir := t.TempDir()
	if _, err := apiauth.Open(filepath.Join(dir, "nope"), apiauth.Options{}); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Errorf("missing file: %v; want an error naming it", err)
	}
	path := filepath.Join(dir, "tokens")
	good, _ := line(t, "ops", true)
	write(t, path, good+"\n\nci admin\n")
	if _, err := apiauth.Open(path, apiauth.Options{}); err == nil || !strings.Contains(err.Error(), path+":3:") {
		t.Errorf("malformed file: %v; want an error naming %s:3", err, path)
	}
}

// Run takes a changed file within its interval — even one rewritten at
// the same size — keeps the last good tokens while the file is malformed
// or gone, logging that once, and stops when its context ends.
func TestRunFollowsTheFile(t *testing.T) {
	first, firstTok := line(t, "first", true)
	second, secondTok := line(t, "second", true) // same length as first
	path := filepath.Join(t.TempDir(), "tokens")
	write(t, path, first+"\n")
	var logs testutil.Buffer
	f, err := apiauth.Open(path, apiauth.Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { f.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	known := func(tok apiauth.Token) bool { _, ok := f.Authenticate(string(tok)); return ok }

	write(t, path, second+"\n")
	testutil.WaitForWhat(t, 5*time.Second, "the second token to be known", func() bool { return known(secondTok) })
	if known(firstTok) {
		t.Error("the token taken out of the file still works")
	}

	write(t, path, second+"\nbroken line\n")
	testutil.WaitForWhat(t, 5*time.Second, "the malformed line to be logged", func() bool { return strings.Contains(logs.String(), path+":2:") })
	if !known(secondTok) {
		t.Error("a malformed file dropped the last good tokens")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	testutil.WaitForWhat(t, 5*time.Second, "the removed file to be logged", func() bool { return strings.Contains(logs.String(), "no such file") })
	if !known(secondTok) {
		t.Error("a removed file dropped the last good tokens")
	}
	write(t, path, first+"\n"+second+"\n")
	testutil.WaitForWhat(t, 5*time.Second, "the first token to be known again", func() bool { return known(firstTok) })
	if n := strings.Count(logs.String(), path+":2:"); n != 1 {
		t.Errorf("the malformed file was reported %d times, want once:\n%s", n, logs.String())
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	for _, tok := range []apiauth.Token{firstTok, secondTok} {
		if strings.Contains(logs.String(), string(tok)) {
			t.Error("a token was logged")
		}
	}
}
