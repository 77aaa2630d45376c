package functionsfile

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// A function's title, icons and output schema are read from the file, and
// a mistake in one is reported under its own field.
func TestTitleIconsAndOutputSchema(t *testing.T) {
	const fn = "functions:\n  - name: weather\n    owner: geo\n    command: [\"cat\"]\n"
	path := testutil.WriteFile(t, "functions.yaml", fn+`    title: Weather now
    icons:
      - src: https://icons.example.com/weather.svg
        mime_type: image/svg+xml
        sizes: [any]
        theme: dark
    output_schema:
      type: object
      properties:
        temperature: {type: number}
`)
	teams, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	f := teams["geo"][0]
	if f.Title != "Weather now" || len(f.Icons) != 1 || f.Icons[0].Src != "https://icons.example.com/weather.svg" ||
		f.Icons[0].Theme != "dark" || f.Icons[0].Sizes[0] != "any" {
		t.Errorf("title %q, icons %+v", f.Title, f.Icons)
	}
	var out map[string]any
	if err := json.Unmarshal(f.OutputSchema, &out); err != nil || out["type"] != "object" {
		t.Errorf("output schema %s (%v)", f.OutputSchema, err)
	}

	for name, c := range map[string]struct{ body, field, want string }{
		"http icon":     {"    icons: [{src: \"http://x.example.com/i.png\"}]\n", "icons", "https URL"},
		"string output": {"    output_schema: {type: string}\n", "output_schema", "object"},
		"bad output":    {"    output_schema: {type: object, properties: {a: {type: nonsense}}}\n", "output_schema", "not a valid JSON Schema"},
		"long title":    {"    title: " + strings.Repeat("w", 300) + "\n", "title", "MaxTitleSize"},
	} {
		_, err := Load(testutil.WriteFile(t, "functions.yaml", fn+c.body))
		if err == nil || !strings.Contains(err.Error(), "(weather): "+c.field+":") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error under %s saying %q", name, err, c.field, c.want)
		}
	}
}
