package yamlfile

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// wrongShape matches yaml's report of a value of the wrong shape:
// "line 4: cannot unmarshal !!str `./scrip...` into []string".
var wrongShape = regexp.MustCompile("^line (\\d+): cannot unmarshal (!!\\w+)(?: `(.*)`)? into (.+)$")

// shapes rewrites yaml's reports of values of the wrong shape, which name
// neither the key nor what it wants, as `line 5: command: a string
// ("./scripts/invoice.sh") was given; command is a list, e.g. command:
// [./scripts/invoice.sh]`. root is the file's parsed document, where the
// key is found by the value's line and tag; keys are as for explain.
type shapes struct {
	pairs []pair
	keys  map[string][]string
}

type pair struct{ key, value *yaml.Node }

func newShapes(root *yaml.Node, keys map[string][]string) *shapes {
	s := &shapes{keys: keys}
	var walk func(n *yaml.Node)
	walk = func(n *yaml.Node) {
		if n.Kind == yaml.MappingNode {
			for i := 0; i+1 < len(n.Content); i += 2 {
				s.pairs = append(s.pairs, pair{n.Content[i], n.Content[i+1]})
			}
		}
		for _, c := range n.Content {
			walk(c)
		}
	}
	walk(root)
	return s
}

// explain returns the rewritten message, or m when it is not about a
// value's shape or its key cannot be told.
func (s *shapes) explain(m string) string {
	sub := wrongShape.FindStringSubmatch(m)
	if sub == nil {
		return m
	}
	line, _ := strconv.Atoi(sub[1])
	value := strings.TrimSuffix(sub[3], "...")
	for i, p := range s.pairs {
		if p.value.Line != line || p.value.ShortTag() != sub[2] || !strings.HasPrefix(p.value.Value, value) {
			continue
		}
		s.pairs = append(s.pairs[:i:i], s.pairs[i+1:]...) // two such values on one line are two errors
		key := p.key.Value
		msg := fmt.Sprintf("line %d: %s: %s was given; %s is %s", line, key, Given(p.value), key, s.wanted(sub[4]))
		if eg := s.example(key, p.value, sub[4]); eg != "" {
			msg += ", e.g. " + eg
		}
		return msg
	}
	return m
}

// Given says in words what a YAML value is: "a list", "a string ("x")".
func Given(n *yaml.Node) string {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a mapping"
	}
	switch n.ShortTag() {
	case "!!str":
		return fmt.Sprintf("a string (%q)", n.Value)
	case "!!int", "!!float":
		return "a number (" + n.Value + ")"
	case "!!bool":
		return n.Value
	case "!!null":
		return "nothing"
	}
	return n.Value
}

// wanted says in words what shape the Go type named goType takes.
func (s *shapes) wanted(goType string) string {
	goType = strings.TrimLeft(goType, "*")
	switch {
	case strings.HasPrefix(goType, "[]"):
		return "a list"
	case strings.HasPrefix(goType, "map["):
		return "a mapping"
	case strings.HasPrefix(goType, "int") || strings.HasPrefix(goType, "uint"):
		return "a whole number"
	case strings.HasPrefix(goType, "float"):
		return "a number"
	case goType == "bool":
		return "true or false"
	case goType == "string":
		return "a string"
	}
	if keys, ok := s.keys[goType]; ok {
		return "a mapping with the keys " + strings.Join(keys, ", ")
	}
	return goType
}

// example shows key with a value of the shape goType wants, made of the
// value given where it can be: a string where a list is wanted becomes a
// list of its words.
func (s *shapes) example(key string, given *yaml.Node, goType string) string {
	goType = strings.TrimLeft(goType, "*")
	switch {
	case strings.HasPrefix(goType, "[]") && given.Kind == yaml.ScalarNode && given.Value != "":
		return fmt.Sprintf("%s: [%s]", key, strings.Join(strings.Fields(given.Value), ", "))
	case len(s.keys[goType]) > 0:
		return fmt.Sprintf("%s: {%s: ...}", key, s.keys[goType][0])
	}
	return ""
}
