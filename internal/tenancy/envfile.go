package tenancy

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// Env files. Each value is written between single quotes, so that a shell
// sourcing the file (`set -a; . ./dispatcher.env; set +a`), systemd's
// EnvironmentFile= and Docker Compose's env_file all read it as written:
// unquoted, a shell would expand the "$JS" of "$JS.team.{team}.API" to
// nothing, and dead letters would then fail with "no responders". A quote
// in a value (a path) is written as '\'' .

// envHeader starts every env file, saying how to use it.
const envHeader = header +
	"# Values are single-quoted, so a shell keeps them as written ($JS... included). Use it with\n" +
	"#   set -a; . ./<this file>; set +a        (or systemd EnvironmentFile=, or compose env_file:)\n" +
	"# not with env $(cat <this file>), which would keep the quotes.\n"

// envFile is the content of an env file setting vars (name, value pairs)
// in order.
func envFile(vars ...[2]string) string {
	var b strings.Builder
	b.WriteString(envHeader)
	for _, v := range vars {
		b.WriteString(v[0] + "=" + shellQuote(v[1]) + "\n")
	}
	return b.String()
}

// shellQuote quotes s for a POSIX shell: between single quotes, inside
// which nothing is special; a quote in s ends the quoting, is written
// escaped with a backslash, and starts it again.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// ReadEnvFile reads an env file Write wrote and returns its settings as
// NAME=value strings (as os/exec.Cmd.Env takes them), with the quoting
// undone: what a shell sourcing the file would set. Blank lines and lines
// starting with # are skipped.
func ReadEnvFile(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, value, ok := strings.Cut(line, "=")
		if !ok || name == "" {
			return nil, fmt.Errorf("tenancy: %s:%d: want NAME='value'", path, n)
		}
		if value, err = shellUnquote(value); err != nil {
			return nil, fmt.Errorf("tenancy: %s:%d: %w", path, n, err)
		}
		out = append(out, name+"="+value)
	}
	return out, sc.Err()
}

// shellUnquote undoes shellQuote; a value without quotes is taken as it is.
func shellUnquote(s string) (string, error) {
	if !strings.HasPrefix(s, "'") {
		return s, nil
	}
	var b strings.Builder
	for len(s) > 0 {
		switch {
		case strings.HasPrefix(s, `\'`):
			b.WriteByte('\'')
			s = s[2:]
		case s[0] == '\'':
			end := strings.IndexByte(s[1:], '\'')
			if end < 0 {
				return "", fmt.Errorf("unterminated quote")
			}
			b.WriteString(s[1 : 1+end])
			s = s[end+2:]
		default:
			return "", fmt.Errorf("unexpected %q after a quoted part: want '...' or \\'", s[0])
		}
	}
	return b.String(), nil
}
