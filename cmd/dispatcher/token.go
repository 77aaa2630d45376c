package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/toolrelay/toolrelay/internal/apiauth"
)

// tokenCmd makes a bearer token for the HTTP API: the token on stdout (so
// a script can take it), and the line for the tokens file, which holds its
// hash only, on stderr or appended to the file.
func tokenCmd(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fl := flag.NewFlagSet("dispatcher token", flag.ContinueOnError)
	fl.SetOutput(stderr)
	name := fl.String("name", "", "the token's name, shown in logs (required; unique in the file)")
	admin := fl.Bool("admin", false, "scope: everything")
	teams := fl.String("teams", "", "scope: these teams only (comma-separated)")
	tools := fl.String("tools", "", "scope: list and call these teams' tools only, on /mcp and GET /v1/tools (comma-separated): an agent's token")
	file := fl.String("file", "", "append the line to this tokens file (created, mode 0600, if missing)")
	fl.Usage = func() {
		fmt.Fprint(stderr, `usage: dispatcher token -name NAME (-admin | -teams TEAM[,TEAM...] | -tools TEAM[,TEAM...]) [-file FILE]

Makes a random bearer token for the HTTP API and prints it on stdout; the token is
shown only then. The line for TOOLRELAY_API_TOKENS_FILE (name, scope and the token's
SHA-256, never the token) goes to stderr, or is appended to -file.

`)
		fl.PrintDefaults()
	}
	if err := fl.Parse(args); err != nil {
		return err
	}
	if fl.NArg() > 0 {
		fl.Usage()
		return fmt.Errorf("token: unexpected arguments %q", fl.Args())
	}
	if n := btoi(*admin) + btoi(*teams != "") + btoi(*tools != ""); n != 1 {
		fl.Usage()
		return errors.New("token: give one of -admin, -teams and -tools")
	}
	tok := apiauth.NewToken()
	var entry apiauth.Entry
	var err error
	if *tools != "" {
		entry, err = apiauth.NewToolsEntry(*name, strings.Split(*tools, ","), tok)
	} else {
		var teamList []string
		if *teams != "" {
			teamList = strings.Split(*teams, ",")
		}
		entry, err = apiauth.NewEntry(*name, *admin, teamList, tok)
	}
	if err != nil {
		return fmt.Errorf("token: %w", err)
	}
	if *file != "" {
		if err := appendEntry(*file, entry); err != nil {
			return fmt.Errorf("token: %w", err)
		}
	}
	fmt.Fprintln(stdout, string(tok))
	if *file != "" {
		fmt.Fprintf(stderr, "added to %s (a running dispatcher takes it within about 2 seconds):\n%s\n", *file, entry)
	} else {
		fmt.Fprintf(stderr, "add this line to the file TOOLRELAY_API_TOKENS_FILE names:\n%s\n", entry)
	}
	return nil
}

// appendEntry adds e's line to the tokens file at path, refusing a line
// that would make the file malformed (a name or token already in it).
func appendEntry(path string, e apiauth.Entry) error {
	have, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	add := e.String() + "\n"
	if len(have) > 0 && have[len(have)-1] != '\n' {
		add = "\n" + add
	}
	if _, err := apiauth.Parse(path, append(have, add...)); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.WriteString(add); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
