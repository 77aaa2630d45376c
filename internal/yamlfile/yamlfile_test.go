package yamlfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type fileFn struct {
	Name       string   `yaml:"name"`
	Command    []string `yaml:"command"`
	Parameters any      `yaml:"parameters"`
}

type file struct {
	Functions []fileFn `yaml:"functions"`
}

func decode(t *testing.T, text string) error {
	t.Helper()
	path := filepath.Join(t.TempDir(), "functions.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	var f file
	return Decode(path, &f, "functions")
}

// From a new user's first hour: a line indented one space off was
// reported at line 1, where its block began.
func TestASyntaxErrorNamesTheLineThatBrokeIt(t *testing.T) {
	for name, tc := range map[string]struct{ text, want string }{
		"indented one space off":          {"functions:\n  - name: a\n    command: [\"./a\"]\n   parameters: {}\n", "line 4:"},
		"after a list over several lines": {"functions:\n  - name: a\n    command: [\n      \"./a\",\n      \"x\"]\n   parameters: {}\n", "line 6:"},
	} {
		t.Run(name, func(t *testing.T) {
			err := decode(t, tc.text)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "indentation") {
				t.Errorf("error = %v; want it at %s, saying to check the indentation", err, tc.want)
			}
		})
	}
}

func TestAnUnknownKeyIsNamedWithTheClosest(t *testing.T) {
	err := decode(t, "functions:\n  - name: a\n    comand: [\"./a\"]\n")
	if err == nil || !strings.Contains(err.Error(), `line 3: unknown key "comand" (did you mean "command"?)`) {
		t.Errorf("error = %v", err)
	}
}

func TestGoodFilesDecode(t *testing.T) {
	if err := decode(t, "functions:\n  - name: a\n    command: [\n      \"./a\"]\n    parameters: {type: object}\n"); err != nil {
		t.Errorf("error = %v", err)
	}
}
