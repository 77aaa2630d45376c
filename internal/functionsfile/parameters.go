package functionsfile

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/internal/yamlfile"
)

// parameters is a function's parameters: a JSON Schema written in YAML.
// Its mistakes are reported at their line as the file is read: a value
// that is not a mapping, and a key misspelling a keyword ("requird"),
// which JSON Schema would ignore, leaving the arguments unchecked.
type parameters struct {
	schema map[string]any
}

func (p *parameters) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		return &yaml.TypeError{Errors: []string{fmt.Sprintf(
			"line %d: parameters: %s was given; parameters is a JSON Schema, a mapping, e.g. parameters: %s",
			n.Line, yamlfile.Given(n), exampleSchema(n))}}
	}
	if err := n.Decode(&p.schema); err != nil {
		return err
	}
	var errs []string
	for _, m := range schema.Misspellings(p.schema) {
		errs = append(errs, fmt.Sprintf("line %d: parameters: %s", lineOf(n, m.Pointer), m))
	}
	if len(errs) > 0 {
		return &yaml.TypeError{Errors: errs}
	}
	return nil
}

// exampleSchema is a schema of the names given instead of one
// (parameters: [order_id]) as string properties, all required.
func exampleSchema(n *yaml.Node) string {
	var names []string
	for _, c := range append([]*yaml.Node{n}, n.Content...) {
		if c.Kind == yaml.ScalarNode && c.Value != "" && !strings.ContainsAny(c.Value, ":{}[], ") {
			names = append(names, c.Value)
		}
	}
	if len(names) == 0 {
		names = []string{"order_id"}
	}
	props := make([]string, len(names))
	for i, name := range names {
		props[i] = name + ": {type: string}"
	}
	return fmt.Sprintf("{type: object, properties: {%s}, required: [%s]}", strings.Join(props, ", "), strings.Join(names, ", "))
}

// lineOf returns the line of the key at pointer (a JSON Pointer) in the
// mapping n, or of the deepest node of its path that the file has.
func lineOf(n *yaml.Node, pointer string) int {
	line := n.Line
	for _, tok := range strings.Split(strings.TrimPrefix(pointer, "/"), "/") {
		tok = strings.NewReplacer("~1", "/", "~0", "~").Replace(tok)
		if n.Kind == yaml.AliasNode && n.Alias != nil {
			n = n.Alias
		}
		var next *yaml.Node
		switch n.Kind {
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				if n.Content[i].Value == tok {
					line, next = n.Content[i].Line, n.Content[i+1]
				}
			}
		case yaml.SequenceNode:
			if i, err := strconv.Atoi(tok); err == nil && i >= 0 && i < len(n.Content) {
				next = n.Content[i]
				line = next.Line
			}
		}
		if next == nil {
			return line
		}
		n = next
	}
	return line
}
