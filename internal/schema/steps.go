package schema

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// The validator applies a subschema to a value once for every path to it:
// two references to one definition are followed twice, and a chain of n
// anyOf of two references to the next is 2^n applications for one value,
// each failure kept in an error tree. It neither bounds nor shares that
// work, so this file counts it before the validator runs:
//
//   - when a schema is compiled, inPlace counts the applications one value
//     takes (following $ref, allOf, anyOf, oneOf, not, if/then/else and
//     dependentSchemas, which apply to the same value), from every
//     subschema, and refuses a schema any of whose subschemas takes more
//     than MaxSteps;
//   - for every call, steps counts the applications the arguments take,
//     as an upper bound (no short cut of anyOf or a failed type is taken),
//     memoised per subschema and value so that the count itself costs at
//     most MaxSteps distinct applications, and Check refuses arguments
//     over MaxSteps without validating them.

// errRefCycle is a reference cycle that never moves into the value: the
// validator reports it on every call; it is refused when declared.
var errRefCycle = errors.New("cycle")

// checkInPlace refuses root if one value applied to any of its subschemas
// takes more than MaxSteps applications, or if its references loop
// without moving into the value.
func checkInPlace(function string, root *jsonschema.Schema) error {
	counted := map[*jsonschema.Schema]int64{}
	seen := map[*jsonschema.Schema]bool{}
	var walk func(s *jsonschema.Schema) error
	walk = func(s *jsonschema.Schema) error {
		if s == nil || seen[s] {
			return nil
		}
		seen[s] = true
		if s.DynamicRef != nil || s.RecursiveRef != nil {
			return &LimitError{Function: function, Limit: "MaxSteps", What: "a $dynamicRef or $recursiveRef", At: location(s),
				Got: 1, Max: 0, Fix: "use $ref: the work a dynamic reference takes cannot be bounded in advance"}
		}
		n, err := inPlace(s, counted, map[*jsonschema.Schema]bool{})
		if errors.Is(err, errRefCycle) {
			return fmt.Errorf("schema of %s: the references at %s loop without moving into the value; every call would fail", function, location(s))
		}
		if n > MaxSteps {
			return &LimitError{Function: function, Limit: "MaxSteps", What: "the work of checking one value", At: location(s),
				Got: n, Max: MaxSteps, Fix: "reference each definition once per alternative rather than in chains of anyOf/oneOf/allOf, or take fewer alternatives"}
		}
		var err2 error
		eachSchema(s, func(c *jsonschema.Schema, _ bool) {
			if err2 == nil {
				err2 = walk(c)
			}
		})
		return err2
	}
	return walk(root)
}

// inPlace counts the applications one value applied to s takes, saturating
// above MaxSteps. counted memoises; onPath finds cycles.
func inPlace(s *jsonschema.Schema, counted map[*jsonschema.Schema]int64, onPath map[*jsonschema.Schema]bool) (int64, error) {
	if n, ok := counted[s]; ok {
		return n, nil
	}
	if onPath[s] {
		return 0, errRefCycle
	}
	onPath[s] = true
	defer delete(onPath, s)
	n := int64(1)
	if s.Enum != nil {
		n += int64(len(s.Enum.Values))
	}
	var err error
	eachSchema(s, func(c *jsonschema.Schema, sameValue bool) {
		if err != nil || !sameValue {
			return
		}
		var m int64
		m, err = inPlace(c, counted, onPath)
		n = min(n+m, MaxSteps+1)
	})
	if err != nil {
		return 0, err
	}
	counted[s] = n
	return n, nil
}

// eachSchema calls f with every subschema s applies, and whether it
// applies it to the same value (true) or to one of the value's members or
// elements (false).
func eachSchema(s *jsonschema.Schema, f func(c *jsonschema.Schema, sameValue bool)) {
	same := func(cs ...*jsonschema.Schema) {
		for _, c := range cs {
			if c != nil {
				f(c, true)
			}
		}
	}
	member := func(cs ...*jsonschema.Schema) {
		for _, c := range cs {
			if c != nil {
				f(c, false)
			}
		}
	}
	same(s.Ref, s.RecursiveRef, s.Not, s.If, s.Then, s.Else)
	if s.DynamicRef != nil {
		same(s.DynamicRef.Ref)
	}
	same(s.AllOf...)
	same(s.AnyOf...)
	same(s.OneOf...)
	for _, c := range s.DependentSchemas {
		same(c)
	}
	for _, d := range s.Dependencies {
		if c, ok := d.(*jsonschema.Schema); ok {
			same(c)
		}
	}
	for _, c := range s.Properties {
		member(c)
	}
	for _, c := range s.PatternProperties {
		member(c)
	}
	member(asSchema(s.AdditionalProperties), s.PropertyNames, s.UnevaluatedProperties)
	switch items := s.Items.(type) {
	case *jsonschema.Schema:
		member(items)
	case []*jsonschema.Schema:
		member(items...)
	}
	member(s.PrefixItems...)
	member(asSchema(s.AdditionalItems), s.Items2020, s.Contains, s.UnevaluatedItems)
}

func asSchema(v any) *jsonschema.Schema {
	s, _ := v.(*jsonschema.Schema)
	return s
}

// location is where s is in its function's schema, as a JSON Pointer.
func location(s *jsonschema.Schema) string {
	_, frag, _ := strings.Cut(s.Location, "#")
	if frag == "" {
		return "/"
	}
	return frag
}

// counter counts the applications arguments take (see steps).
type counter struct {
	done map[countKey]int64
	work int // distinct applications counted, bounded by MaxSteps
}

type countKey struct {
	s *jsonschema.Schema
	v *value
}

// value is a value of the arguments, with its members or elements, so
// that counter can tell values apart.
type value struct {
	v    any
	keys []string // an object's keys, in the order of kids
	kids []*value
}

func newValue(v any) *value {
	n := &value{v: v}
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			n.keys = append(n.keys, k)
			n.kids = append(n.kids, newValue(e))
		}
	case []any:
		for _, e := range v {
			n.kids = append(n.kids, newValue(e))
		}
	}
	return n
}

// steps counts, saturating above MaxSteps, the applications validating v
// against s takes.
func (c *counter) steps(s *jsonschema.Schema, v *value) int64 {
	if s == nil {
		return 0
	}
	k := countKey{s, v}
	if n, ok := c.done[k]; ok {
		return n
	}
	c.work++
	if c.work > MaxSteps {
		return MaxSteps + 1
	}
	n := int64(1)
	if s.Enum != nil {
		n += int64(len(s.Enum.Values))
	}
	add := func(m int64) { n = min(n+m, MaxSteps+1) }
	eachSchema(s, func(sub *jsonschema.Schema, sameValue bool) {
		if sameValue {
			add(c.steps(sub, v))
		}
	})
	switch v.v.(type) {
	case map[string]any:
		for i, kid := range v.kids {
			if sub := s.Properties[v.keys[i]]; sub != nil {
				add(c.steps(sub, kid))
			}
			for _, sub := range s.PatternProperties {
				add(c.steps(sub, kid))
			}
			add(c.steps(asSchema(s.AdditionalProperties), kid))
			add(c.steps(s.UnevaluatedProperties, kid))
			if s.PropertyNames != nil {
				add(c.steps(s.PropertyNames, &value{v: v.keys[i]}))
			}
		}
	case []any:
		for i, kid := range v.kids {
			switch items := s.Items.(type) {
			case *jsonschema.Schema:
				add(c.steps(items, kid))
			case []*jsonschema.Schema:
				if i < len(items) {
					add(c.steps(items[i], kid))
				}
			}
			if i < len(s.PrefixItems) {
				add(c.steps(s.PrefixItems[i], kid))
			}
			add(c.steps(asSchema(s.AdditionalItems), kid))
			add(c.steps(s.Items2020, kid))
			add(c.steps(s.Contains, kid))
			add(c.steps(s.UnevaluatedItems, kid))
		}
	}
	c.done[k] = n
	return n
}

// walkArgs checks the numbers of arguments v against MaxNumberDigits and
// MaxExponentDigits, and returns how many values v holds, itself
// included, counting an object's member names as values too
// (propertyNames applies to them). A number over a bound is a
// *LimitError saying where it is.
func walkArgs(function string, v any) (int64, error) {
	n := int64(1)
	switch v := v.(type) {
	case json.Number:
		return n, checkNumber(function, string(v), "")
	case map[string]any:
		for k, e := range v {
			m, err := walkArgs(function, e)
			if err != nil {
				return 0, within(pointerEscaper.Replace(k), err)
			}
			n += 1 + m
		}
	case []any:
		for i, e := range v {
			m, err := walkArgs(function, e)
			if err != nil {
				return 0, within(strconv.Itoa(i), err)
			}
			n += m
		}
	}
	return n, nil
}

// within puts the place of err's LimitError under the member or element
// tok: the path is only written out for arguments that break a bound.
func within(tok string, err error) error {
	if le, ok := err.(*LimitError); ok {
		le.At = "/" + tok + le.At
	}
	return err
}

// perValue bounds the applications one value of the arguments takes, for
// a schema none of whose subschemas is reached twice (no $ref, nothing
// shared): every subschema then applies at most once to any value, so
// arguments of n values take at most perValue × n applications, and
// counting them would only confirm it. It returns 0 for a schema with
// shared subschemas, whose arguments are counted on every call.
func perValue(root *jsonschema.Schema) int64 {
	seen := map[*jsonschema.Schema]bool{}
	var w int64
	var walk func(s *jsonschema.Schema) bool
	walk = func(s *jsonschema.Schema) bool {
		if seen[s] || s.Ref != nil {
			return false
		}
		seen[s] = true
		w++
		if s.Enum != nil {
			w += int64(len(s.Enum.Values))
		}
		tree := true
		eachSchema(s, func(c *jsonschema.Schema, _ bool) { tree = tree && walk(c) })
		return tree
	}
	if !walk(root) {
		return 0
	}
	return w
}
