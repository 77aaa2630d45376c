// Package schematest builds the hostile parameter schemas of issue 39
// ("schemas as weapons"), so the unit tests of package schema and the
// black-box tests in deploy/nats make the same attacks.
package schematest

import (
	"fmt"
	"strings"
)

// NestedItems is an object schema whose one property is an array of
// arrays depth levels deep: "items" nested depth times. The issue's
// attack had depth 2,600.
func NestedItems(depth int) []byte {
	return []byte(`{"type":"object","properties":{"a":` +
		strings.Repeat(`{"type":"array","items":`, depth) + `{"type":"string"}` + strings.Repeat(`}`, depth) + `}}`)
}

// HugeMultipleOf is an object schema whose property "n" must be a
// multiple of a number of digits digits. The attack had 900,000.
func HugeMultipleOf(digits int) []byte {
	return []byte(`{"type":"object","properties":{"n":{"type":"number","multipleOf":1` + strings.Repeat("7", digits-1) + `}}}`)
}

// RefChain is an object schema whose property "a" is checked against a
// chain of n definitions, each an anyOf of two references to the next,
// ending in one no value of the attack's arguments matches: validating
// one value walks 2^n paths. The attack had n = 19 (1,279 bytes).
func RefChain(n int) []byte {
	var b strings.Builder
	b.WriteString(`{"type":"object","properties":{"a":{"$ref":"#/$defs/d0"}},"$defs":{`)
	for i := range n {
		fmt.Fprintf(&b, `"d%d":{"anyOf":[{"$ref":"#/$defs/d%d"},{"$ref":"#/$defs/d%d"}]},`, i, i+1, i+1)
	}
	fmt.Fprintf(&b, `"d%d":{"type":"string","minLength":2}}}`, n)
	return []byte(b.String())
}

// RefChainArgs are arguments that match no path of RefChain, so that
// every path is walked.
var RefChainArgs = []byte(`{"a":"x"}`)
