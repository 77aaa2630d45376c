// Package yamlfile decodes the YAML files teams write by hand — functions
// files and scenarios files — strictly, so that a mistyped key is an error
// rather than a setting silently ignored.
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolrelay/toolrelay/internal/suggest"
)

// Decode reads the YAML (or JSON) file at path into v, refusing keys v
// has no field for. An empty file is an error saying it needs the
// top-level list named list. Errors start with the path and name the line
// and the key; each mistake is on a line of its own.
func Decode(path string, v any, list string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: the file is empty; it needs a %s: list", path, list)
		}
		var te *yaml.TypeError
		if errors.As(err, &te) {
			keys := keysOf(reflect.TypeOf(v))
			var root yaml.Node
			_ = yaml.Unmarshal(data, &root) // it parsed once already
			msgs := explain(te.Errors, keys, newShapes(&root, keys))
			return errors.New(path + ": " + strings.Join(msgs, "\n"+path+": "))
		}
		return fmt.Errorf("%s: %w", path, located(err, data))
	}
	return nil
}

// syntaxError matches a YAML syntax error: yaml names the line where the
// block it was reading began, not the line that broke it.
var syntaxError = regexp.MustCompile(`^yaml: line (\d+): (.+)$`)

// located rewrites a syntax error to name the first line at which the file
// stops being YAML (a line indented one space off, say), found by parsing
// ever longer beginnings of data; other errors, and files too long to
// search, pass as they are.
func located(err error, data []byte) error {
	m := syntaxError.FindStringSubmatch(err.Error())
	lines := bytes.SplitAfter(data, []byte("\n"))
	if m == nil || len(lines) > 5000 {
		return err
	}
	for n := 1; n <= len(lines); n++ {
		var node yaml.Node
		perr := yaml.Unmarshal(bytes.Join(lines[:n], nil), &node)
		// A beginning may end inside a construct (a list in brackets over
		// several lines): only the file's own complaint counts.
		if perr == nil || !strings.HasSuffix(perr.Error(), ": "+m[2]) {
			continue
		}
		if at := strconv.Itoa(n); at != m[1] {
			return fmt.Errorf("yaml: line %s: %s (in the block that begins at line %s: check this line's indentation)", at, m[2], m[1])
		}
		return err
	}
	return err
}

// unknownField matches yaml's report of a key the target has no field for.
var unknownField = regexp.MustCompile(`^line (\d+): field (.+) not found in type (\S+)$`)

// explain rewrites yaml's "field paramters not found in type
// functionsfile.functionConfig", which names a Go type the writer of the
// file never saw, as `line 3: unknown key "paramters" (did you mean
// "parameters"?)`, suggesting the known key closest to the typo; and a
// value of the wrong shape as shapes does. Other messages pass as they are.
func explain(msgs []string, keys map[string][]string, shapes *shapes) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		sub := unknownField.FindStringSubmatch(m)
		if sub == nil {
			out[i] = shapes.explain(m)
			continue
		}
		out[i] = fmt.Sprintf("line %s: unknown key %q", sub[1], sub[2])
		if near := suggest.Closest(sub[2], keys[sub[3]]); near != "" {
			out[i] += fmt.Sprintf(" (did you mean %q?)", near)
		} else if known := keys[sub[3]]; len(known) > 0 {
			out[i] += " (known keys here: " + strings.Join(known, ", ") + ")"
		}
	}
	return out
}

// keysOf maps the name of each struct type reachable from t, as yaml names
// it in errors, to the keys its fields take.
func keysOf(t reflect.Type) map[string][]string {
	keys := map[string][]string{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct {
			return
		}
		if _, seen := keys[t.String()]; seen {
			return
		}
		keys[t.String()] = nil
		for f := range t.Fields() {
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "-" || !f.IsExported() {
				continue
			}
			if name == "" {
				name = strings.ToLower(f.Name)
			}
			keys[t.String()] = append(keys[t.String()], name)
			walk(f.Type)
		}
	}
	walk(t)
	return keys
}
