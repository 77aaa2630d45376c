// Package apiauth keeps the bearer tokens of the dispatcher's HTTP API
// (TOOLRELAY_API_TOKENS_FILE): a file of token hashes, each scoped to admin
// or to some teams, re-read when it changes.
//
// It may import pkg/dispatch (whose Authenticator it implements) and
// pkg/protocol (team names); the dispatcher command wires it in.
//
// # The file
//
// One token a line, three fields separated by spaces or tabs; blank lines
// and lines starting with # are ignored:
//
//		# name      scope                 hash of the token
//		ops         admin                 sha256:0794951f7d8fa97197b736a2ed06259ea9f70f8a9cfa58701c95a48355d5fa5e
//		orders-ci   teams:orders,billing  sha256:374a6eef8f08a00a6f7ae2bfdf95a53ec207d9891328a82cd8e85a8094e11eb3
//		support-bot tools:orders          sha256:9a3c8f1f0e6f3f2b9f7d5c0f2b1a8e7d6c5b4a3928170615f4e3d2c1b0a99887
//
//	  - name identifies the token in logs (letters, digits, and . _ - @;
//	    at most 64), unique in the file;
//	  - scope is admin (sees everything), teams: followed by a
//	    comma-separated list of team names (sees those teams: their
//	    functions, calls, dead letters), or tools: followed by such a list
//	    (may list and call those teams' tools, on /mcp and GET /v1/tools,
//	    and nothing else: the token to give an agent);
//	  - hash is sha256: and the lower-case hex SHA-256 of the token. The
//	    file never holds a token itself, so reading it grants nothing.
//
// [NewToken] makes a random token and [Entry.String] the line for it
// (`dispatcher token` does both).
package apiauth

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// ErrMalformed is wrapped by every error about the content of a tokens file.
var ErrMalformed = errors.New("apiauth: malformed tokens file")

// TokenPrefix starts every token NewToken makes, so that secret scanners
// (and people) can tell a toolrelay token.
const TokenPrefix = "trk_"

const (
	hashPrefix = "sha256:"
	adminScope = "admin"
	teamsScope = "teams:"
	toolsScope = "tools:"
	maxName    = 64
)

// Token is a bearer token: a secret, which prints and logs as REDACTED.
// Convert it with string(t) to hand it over.
type Token string

func (Token) String() string       { return "REDACTED" }
func (Token) LogValue() slog.Value { return slog.StringValue("REDACTED") }
func (t Token) GoString() string   { return t.String() }

// NewToken returns a new random token: TokenPrefix and 32 random bytes in
// URL-safe base64.
func NewToken() Token {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return Token(TokenPrefix + base64.RawURLEncoding.EncodeToString(b))
}

// Hash is how a token is stored: "sha256:" and the hex SHA-256 of it.
func Hash(token Token) string {
	sum := sha256.Sum256([]byte(token))
	return hashPrefix + hex.EncodeToString(sum[:])
}

// Entry is one line of a tokens file: a token's name, scope and hash.
type Entry struct {
	Name string
	// Admin tokens see everything; the others see Teams.
	Admin bool
	Teams []string
	// ToolsOnly tokens may list and call Teams' tools, nothing else
	// (scope tools:).
	ToolsOnly bool
	// Hash is the token's Hash.
	Hash string
}

// NewEntry is the entry of token, named name, for admin or for teams.
func NewEntry(name string, admin bool, teams []string, token Token) (Entry, error) {
	e := Entry{Name: name, Admin: admin, Teams: teams, Hash: Hash(token)}
	if err := e.validate(); err != nil {
		return Entry{}, fmt.Errorf("apiauth: %w", err)
	}
	return e, nil
}

// NewToolsEntry is the entry of token, named name, that may list and call
// the tools of teams and do nothing else (scope tools:).
func NewToolsEntry(name string, teams []string, token Token) (Entry, error) {
	e := Entry{Name: name, Teams: teams, ToolsOnly: true, Hash: Hash(token)}
	if err := e.validate(); err != nil {
		return Entry{}, fmt.Errorf("apiauth: %w", err)
	}
	return e, nil
}

// String is e's line in a tokens file.
func (e Entry) String() string {
	scope := adminScope
	switch {
	case e.ToolsOnly:
		scope = toolsScope + strings.Join(e.Teams, ",")
	case !e.Admin:
		scope = teamsScope + strings.Join(e.Teams, ",")
	}
	return e.Name + " " + scope + " " + e.Hash
}

// Caller is who a request with e's token comes from.
func (e Entry) Caller() dispatch.Caller {
	return dispatch.Caller{Name: e.Name, Admin: e.Admin, Teams: e.Teams, ToolsOnly: e.ToolsOnly}
}

func (e Entry) validate() error {
	if err := validateName(e.Name); err != nil {
		return err
	}
	if e.Admin == (len(e.Teams) > 0) || e.Admin && e.ToolsOnly {
		return errors.New("a token is scoped to admin or to one or more teams, not both or neither")
	}
	for _, team := range e.Teams {
		if err := protocol.ValidateTeamName(team); err != nil {
			return fmt.Errorf("scope: team name %q must match %s", team, protocol.TeamNamePattern)
		}
	}
	if _, err := decodeHash(e.Hash); err != nil {
		return err
	}
	return nil
}

func validateName(name string) error {
	if name == "" || len(name) > maxName {
		return fmt.Errorf("name must be 1 to %d characters", maxName)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-@", r)) {
			return errors.New("name may hold letters, digits, '.', '_', '-' and '@' only")
		}
	}
	return nil
}

// decodeHash reads the hash field. Its errors never quote the field: a
// token pasted there by mistake must not reach a log.
func decodeHash(field string) ([sha256.Size]byte, error) {
	var sum [sha256.Size]byte
	if strings.HasPrefix(field, TokenPrefix) {
		return sum, errors.New("the third field is a token, not its hash: the file holds hashes only (`dispatcher token` prints the line to add)")
	}
	hexSum, ok := strings.CutPrefix(field, hashPrefix)
	if !ok || len(hexSum) != 2*sha256.Size || strings.ToLower(hexSum) != hexSum {
		return sum, errors.New("the third field must be sha256: and 64 lower-case hex digits, the hash of the token (`dispatcher token` prints the line to add)")
	}
	if _, err := hex.Decode(sum[:], []byte(hexSum)); err != nil {
		return sum, errors.New("the third field must be sha256: and 64 lower-case hex digits, the hash of the token")
	}
	return sum, nil
}

// Parse reads the content of a tokens file; name (its path) is only for
// errors, which give it and the line: "apiauth: tokens.txt:3: ...", and
// wrap ErrMalformed.
func Parse(name string, data []byte) ([]Entry, error) {
	var entries []Entry
	names := map[string]int{}
	hashes := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 64<<10)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		e, err := parseLine(line)
		if err == nil {
			if first, dup := names[e.Name]; dup {
				err = fmt.Errorf("name %s is already used on line %d", e.Name, first)
			} else if first, dup := hashes[e.Hash]; dup {
				err = fmt.Errorf("the same token hash is already on line %d", first)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%w: %s:%d: %v", ErrMalformed, name, n, err)
		}
		names[e.Name], hashes[e.Hash] = n, n
		entries = append(entries, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, name, err)
	}
	return entries, nil
}

func parseLine(line string) (Entry, error) {
	fields := strings.Fields(line)
	if len(fields) != 3 {
		return Entry{}, fmt.Errorf("want 3 fields (name, scope, sha256:<hash of the token>), got %d", len(fields))
	}
	e := Entry{Name: fields[0], Hash: fields[2]}
	switch scope := fields[1]; {
	case scope == adminScope:
		e.Admin = true
	case strings.HasPrefix(scope, teamsScope):
		e.Teams = strings.Split(strings.TrimPrefix(scope, teamsScope), ",")
	case strings.HasPrefix(scope, toolsScope):
		e.Teams, e.ToolsOnly = strings.Split(strings.TrimPrefix(scope, toolsScope), ","), true
	default:
		return Entry{}, errors.New("the scope (second field) must be admin, teams:<team>[,<team>...] or tools:<team>[,<team>...]")
	}
	if err := e.validate(); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// tokenSet is one good version of the file, never changed once built.
type tokenSet struct {
	entries []Entry
	sums    [][sha256.Size]byte
}

func newTokenSet(entries []Entry) *tokenSet {
	s := &tokenSet{entries: entries, sums: make([][sha256.Size]byte, len(entries))}
	for i, e := range entries {
		s.sums[i], _ = decodeHash(e.Hash) // validated by Parse
	}
	return s
}

// lookup compares the token's hash with every entry's in constant time,
// without stopping at a match, so neither which entry matched nor how
// much of a hash did shows in the time it takes.
func (s *tokenSet) lookup(token string) (Entry, bool) {
	sum := sha256.Sum256([]byte(token))
	found := -1
	for i := range s.sums {
		if subtle.ConstantTimeCompare(sum[:], s.sums[i][:]) == 1 {
			found = i
		}
	}
	if found < 0 {
		return Entry{}, false
	}
	return s.entries[found], true
}
