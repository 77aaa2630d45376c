package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/schema/schematest"
)

// The attacks of issue 39 are refused when the schema is declared, each
// with an error naming the bound and how to stay within it.
func TestAttacksRefusedWhenCompiled(t *testing.T) {
	tests := []struct {
		name  string
		raw   []byte
		limit string
		want  []string // substrings of the error
	}{
		{"items nested 2,600 deep", schematest.NestedItems(2600), "MaxDepth",
			[]string{"schema of f: nesting at /properties/a/items/items/", "is 65, over the limit of 64 (MaxDepth); flatten the parameters"}},
		{"multipleOf of 900k digits", schematest.HugeMultipleOf(900_000), "MaxSize",
			[]string{"schema of f: the schema's size in bytes is 900068, over the limit of 65536 (MaxSize)"}},
		{"multipleOf of 60k digits", schematest.HugeMultipleOf(60_000), "MaxNumberDigits",
			[]string{"schema of f: the digits of a number at /properties/n/multipleOf is 60000, over the limit of 32 (MaxNumberDigits); round it"}},
		{"exponent of 7 digits", []byte(`{"type":"object","properties":{"n":{"maximum":1e1000000}}}`), "MaxExponentDigits",
			[]string{"at /properties/n/maximum is 7, over the limit of 3 (MaxExponentDigits)"}},
		{"anyOf/$ref chain of 19", schematest.RefChain(19), "MaxSteps",
			[]string{"schema of f: the work of checking one value at /properties/a is 10001, over the limit of 10000 (MaxSteps); reference each definition once"}},
		{"dynamic reference", []byte(`{"$dynamicAnchor":"n","type":"object","properties":{"a":{"$dynamicRef":"#n"}}}`), "MaxSteps",
			[]string{"a $dynamicRef or $recursiveRef at /properties/a", "use $ref"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Compile("f", tc.raw)
			var le *LimitError
			if !errors.As(err, &le) || !errors.Is(err, ErrLimit) {
				t.Fatalf("Compile = %v, want a LimitError", err)
			}
			if le.Limit != tc.limit {
				t.Errorf("refused by %s, want %s", le.Limit, tc.limit)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// Arguments whose validation would take more than MaxSteps are refused
// unchecked: a schema that takes a few steps per value but whose two
// alternatives both recurse into an array doubles its work at every
// level of nesting of the arguments.
func TestCheckBoundsWorkPerCall(t *testing.T) {
	raw := []byte(`{"type":"object","properties":{"a":{"$ref":"#/$defs/t"}},"$defs":{"t":{"anyOf":[
		{"type":"array","items":{"$ref":"#/$defs/t"}},{"type":"array","items":{"$ref":"#/$defs/t"},"minItems":0}]}}}`)
	s, err := Compile("tree", raw)
	if err != nil {
		t.Fatal(err)
	}
	if msg := s.Check([]byte(`{"a":[[[]]]}`)); msg != "" {
		t.Fatalf("shallow arguments refused: %s", msg)
	}
	deep := []byte(`{"a":` + strings.Repeat("[", 40) + strings.Repeat("]", 40) + `}`)
	var msg string
	allocs := testing.AllocsPerRun(3, func() { msg = s.Check(deep) })
	want := "The arguments for tree were not checked: checking them against its parameters would take more than 10000 steps, the most a call may take (MaxSteps)."
	if !strings.Contains(msg, want) {
		t.Fatalf("Check = %q, want it to say %q", msg, want)
	}
	// 2^40 applications unbounded; counted, a few per subschema and value.
	if allocs > 5000 {
		t.Errorf("refusing the arguments took %.0f allocations", allocs)
	}
}

// Numbers in the arguments are bounded as in schemas: the validator reads
// them as exact fractions.
func TestCheckRefusesNumbersOverTheBound(t *testing.T) {
	s, err := Compile("f", []byte(`{"type":"object","properties":{"n":{"type":"number","multipleOf":7}}}`))
	if err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		`{"n":14}`:                               "",
		`{"n":1e999}`:                            "do not match",
		`{"n":1e1000000}`:                        "The arguments for f have a number at /n with more digits than a call may carry (7, over 3).",
		`{"n":` + strings.Repeat("7", 100) + `}`: "The arguments for f have a number at /n with more digits than a call may carry (100, over 32).",
		`{"x":[0,{"y":` + strings.Repeat("1", 33) + `}]}`: "at /x/1/y",
	} {
		got := s.Check([]byte(args))
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("Check(%.40s) = %q, want %q", args, got, want)
		}
	}
}

// Schemas that use what the bounds leave (recursion, alternatives,
// definitions referenced more than once) compile and check as before.
func TestBoundsLeaveOrdinarySchemas(t *testing.T) {
	raw := []byte(`{"type":"object","required":["q"],"properties":{
		"q":{"type":"string","pattern":"^[a-z ]+$"},
		"when":{"anyOf":[{"$ref":"#/$defs/date"},{"type":"null"}]},
		"until":{"$ref":"#/$defs/date"},
		"filter":{"$ref":"#/$defs/node"},
		"limit":{"type":"integer","minimum":1,"maximum":1000,"multipleOf":0.5}},
		"$defs":{"date":{"type":"string","format":"date"},
		"node":{"oneOf":[{"type":"object","properties":{"and":{"type":"array","items":{"$ref":"#/$defs/node"}}},"required":["and"]},
		{"type":"object","properties":{"field":{"enum":["a","b","c"]}},"required":["field"]}]}}}`)
	s, err := Compile("search", raw)
	if err != nil {
		t.Fatal(err)
	}
	args := `{"q":"cats","when":null,"until":"2026-01-02","limit":10,"filter":{"and":[{"field":"a"},{"and":[{"field":"b"},{"field":"c"}]}]}}`
	if msg := s.Check([]byte(args)); msg != "" {
		t.Fatalf("valid arguments refused: %s", msg)
	}
	if msg := s.Check([]byte(`{"q":"cats","filter":{"and":[{"field":"z"}]}}`)); !strings.Contains(msg, "do not match") {
		t.Fatalf("invalid arguments: %q", msg)
	}
	// The deepest nesting MaxDepth allows compiles.
	if _, err := Compile("f", schematest.NestedItems((MaxDepth-3)/2)); err != nil {
		t.Fatal(err)
	}
}

// A schema within the bounds compiles within a memory budget: the worst
// shapes found within them (the deepest nesting, the most alternatives,
// the longest chain of references, the most properties, the largest
// patterns) each allocate under compileBudget.
func TestCompileWithinBudget(t *testing.T) {
	const compileBudget = 64 << 20
	list := func(prefix, suffix string, n int, item func(i int) string) []byte {
		var b bytes.Buffer
		b.WriteString(prefix)
		for i := range n {
			if i > 0 {
				b.WriteString(",")
			}
			b.WriteString(item(i))
		}
		b.WriteString(suffix)
		return b.Bytes()
	}
	for name, raw := range map[string][]byte{
		"deepest": schematest.NestedItems((MaxDepth - 3) / 2),
		"alternatives": list(`{"type":"object","properties":{"a":{"anyOf":[`, `]}}}`, 2000,
			func(i int) string { return fmt.Sprintf(`{"minLength":%d}`, i) }),
		"chain": list(`{"type":"object","properties":{"a":{"$ref":"#/$defs/d0"}},"$defs":{`, `,"d2000":{}}}`, 2000,
			func(i int) string { return fmt.Sprintf(`"d%d":{"$ref":"#/$defs/d%d"}`, i, i+1) }),
		"properties": list(`{"type":"object","properties":{`, `}}`, 2400,
			func(i int) string { return fmt.Sprintf(`"p%d":{"type":"string"}`, i) }),
		"patterns": list(`{"type":"object","properties":{`, `}}`, 4,
			func(i int) string { return fmt.Sprintf(`"p%d":{"pattern":"^(b|a{1,%d})$"}`, i, 990-i) }),
	} {
		if len(raw) > MaxSize {
			t.Fatalf("%s: %d bytes, over MaxSize", name, len(raw))
		}
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		_, err := Compile("f", raw)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		n := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d bytes compiled with %.1f MB allocated", name, len(raw), float64(n)/(1<<20))
		if n > compileBudget {
			t.Errorf("%s: compiling allocated %d MB, over the budget of %d MB", name, n>>20, compileBudget>>20)
		}
	}
}

// checkLimits refuses exactly what breaks a bound or is not one JSON
// value, as a plain decode and walk over the document finds.
func FuzzCheckLimits(f *testing.F) {
	for _, s := range append(decodeSeeds,
		string(schematest.NestedItems(40)), string(schematest.RefChain(3)),
		`{"a":`+strings.Repeat("9", 40)+`}`, `[1e1234]`, `{"a/b~":[[{"c":1.00000000000000000000000000000000001}]]}`) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		err := checkLimits("f", raw)
		var le *LimitError
		limited := errors.As(err, &le)
		if !json.Valid(raw) {
			if err == nil {
				t.Fatalf("checkLimits accepted %q, which is not JSON", raw)
			}
			return
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		var v any
		if dec.Decode(&v) != nil {
			t.Skip() // deeper than encoding/json reads
		}
		want := walkLimits(v, 1)
		switch {
		case want == "" && err != nil:
			t.Fatalf("checkLimits(%q) = %v; it breaks no bound", raw, err)
		case want != "" && !limited:
			t.Fatalf("checkLimits(%q) = %v; it breaks %s", raw, err, want)
		case want != "" && len(raw) <= MaxSize && le.Limit != want && !(want == "MaxNumberDigits" || le.Limit == "MaxNumberDigits" || le.Limit == "MaxExponentDigits"):
			// Which of two bounds broken is named first depends on order.
			t.Fatalf("checkLimits(%q) named %s; it breaks %s", raw, le.Limit, want)
		}
	})
}

// walkLimits names a bound v breaks, or "", v being at nesting depth.
func walkLimits(v any, depth int) string {
	switch v := v.(type) {
	case json.Number:
		if checkNumber("f", string(v), "") != nil {
			return "MaxNumberDigits"
		}
	case map[string]any:
		if depth > MaxDepth {
			return "MaxDepth"
		}
		for _, e := range v {
			if w := walkLimits(e, depth+1); w != "" {
				return w
			}
		}
	case []any:
		if depth > MaxDepth {
			return "MaxDepth"
		}
		for _, e := range v {
			if w := walkLimits(e, depth+1); w != "" {
				return w
			}
		}
	}
	return ""
}

// A compilation over its time budget is given up on with a LimitError,
// and its place among maxCompiling is freed when it ends.
func TestCompileGivesUpAfterTimeout(t *testing.T) {
	raw := []byte(`{"type":"object","properties":{"p":{"type":"string"}}}`)
	var props []string
	for i := range 2000 {
		props = append(props, fmt.Sprintf(`"p%d":{"type":"string"}`, i))
	}
	big := []byte(`{"type":"object","properties":{` + strings.Join(props, ",") + `}}`)
	var doc any
	if err := json.Unmarshal(big, &doc); err != nil {
		t.Fatal(err)
	}
	_, err := compileWithin("f", doc, time.Microsecond)
	want := "schema of f: the time to compile it, in milliseconds, is over the limit of 0 (CompileTimeout); simplify it"
	if !errors.Is(err, ErrLimit) || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("compileWithin = %v, want %q", err, want)
	}
	if _, err := Compile("f", raw); err != nil {
		t.Fatalf("a schema compiled after one given up on: %v", err)
	}
}

// A schema none of whose subschemas is shared is not counted per call
// when perValue × values is within MaxSteps: that is sound only if the
// count never passes the bound, which this checks on schemas that use
// every keyword applying subschemas, against nested arguments; one with a
// $ref is counted every time.
func TestPerValueBoundsTheCount(t *testing.T) {
	leaf := `{"type":"string","enum":["a","b","c"]}`
	schemas := []string{
		`{"type":"object","properties":{"a":` + leaf + `,"b":{"type":"array","items":` + leaf + `}}}`,
		`{"anyOf":[{"type":"object","additionalProperties":{"anyOf":[` + leaf + `,{"type":"array","prefixItems":[` + leaf + `],"items":{"type":"object"}}]}},{"not":{"type":"null"}}],
			"if":{"type":"object"},"then":{"propertyNames":{"maxLength":3}},"else":{"oneOf":[{"type":"array","contains":` + leaf + `},{"type":"string"}]}}`,
		`{"type":"object","patternProperties":{"^a":{"allOf":[{"type":"object","unevaluatedProperties":` + leaf + `}]},"^b":{"type":"array","items":{"patternProperties":{".":` + leaf + `}}}},
			"dependentSchemas":{"a":{"required":["b"]}}}`,
	}
	args := []string{`{}`, `"x"`, `[]`, `{"a":"a","b":["a","b",1]}`, `{"aa":{"x":"a","y":[{"z":1},"b"]},"b":[{"q":"c"},{"r":[1,2,{"s":"a"}]}]}`,
		`[{"a":[[["a"]]]},{"b":{"c":{"d":{"e":["a","b","c"]}}}}]`, `{"abc":{"abc":{"abc":{"abc":"a"}}},"bcd":[{"b":"a"},{"bb":"b"}]}`}
	for _, raw := range schemas {
		s, err := Compile("f", []byte(raw))
		if err != nil {
			t.Fatal(err)
		}
		if s.perValue == 0 {
			t.Fatalf("%.60s: shares no subschema, but is counted on every call", raw)
		}
		for _, a := range args {
			inst, err := decode([]byte(a))
			if err != nil {
				t.Fatal(err)
			}
			n, err := walkArgs("f", inst)
			if err != nil {
				t.Fatal(err)
			}
			c := counter{done: map[countKey]int64{}}
			if got, bound := c.steps(s.s, newValue(inst)), s.perValue*n; got > bound {
				t.Errorf("%.60s with %s: %d steps, over the bound %d × %d", raw, a, got, s.perValue, n)
			}
		}
	}
	s, err := Compile("f", []byte(`{"$defs":{"t":{"type":"string"}},"properties":{"a":{"$ref":"#/$defs/t"}}}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.perValue != 0 {
		t.Errorf("a schema with a $ref has perValue %d; want it counted on every call", s.perValue)
	}
}
