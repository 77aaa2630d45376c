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

// A value of the wrong shape names its key, what was given and what is
// wanted, with an example made of what was given.
func TestAValueOfTheWrongShapeNamesItsKey(t *testing.T) {
	err := decode(t, "functions:\n  - name: a\n    command: ./bin/a --fast\n")
	if want := `line 3: command: a string ("./bin/a --fast") was given; command is a list, e.g. command: [./bin/a, --fast]`; err == nil || !strings.HasSuffix(err.Error(), want) {
		t.Errorf("error = %v; want it to end %s", err, want)
	}
	err = decode(t, "functions:\n  - {name: a, command: x}\n  - {name: [b], command: y}\n")
	for _, want := range []string{`line 2: command: a string ("x") was given`, `line 3: name: a list was given; name is a string`, `line 3: command: a string ("y")`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error = %v; want it to contain %s", err, want)
		}
	}
	if n := strings.Count(err.Error(), "\n"); n != 2 {
		t.Errorf("error = %v; want each of its 3 mistakes on a line of its own", err)
	}
}
