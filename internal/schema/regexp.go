package schema

import (
	"fmt"
	"regexp"
	"regexp/syntax"
	"sync/atomic"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// MaxPatternSize bounds the regular expressions of a schema ("pattern",
// "patternProperties", and strings its "format": "regex" checks), in the
// instructions their programs take when compiled, all a schema's patterns
// together, and each string a call's format check compiles. Go's
// regexp matches in time linear in the input; what a pattern costs is
// the size of its program, which a counted repetition multiplies
// (a{1,900} is 900 copies of a).
const MaxPatternSize = 10_000

// patterns is the regexp engine of one compilation: it refuses patterns
// whose programs together would be over MaxPatternSize while the schema
// compiles, and each one over it after.
type patterns struct {
	function string
	total    int
	seen     map[string]bool // counted already (the metaschema's check compiles each pattern too)
	over     *LimitError     // the first pattern over the bound
	compiled atomic.Bool     // the schema compiled: count patterns one by one
}

func (p *patterns) compile(pattern string) (jsonschema.Regexp, error) {
	re, err := syntax.Parse(pattern, syntax.Perl)
	if err != nil {
		return nil, err
	}
	n := programSize(re)
	if p.compiled.Load() {
		if n > MaxPatternSize {
			return nil, fmt.Errorf("a program of %d instructions, over the limit of %d (MaxPatternSize)", n, MaxPatternSize)
		}
		return regexp.Compile(pattern)
	}
	if !p.seen[pattern] {
		if p.seen == nil {
			p.seen = map[string]bool{}
		}
		p.seen[pattern] = true
		p.total = min(p.total+n, MaxPatternSize+1)
	}
	if p.total > MaxPatternSize && p.over == nil {
		p.over = &LimitError{Function: p.function, Limit: "MaxPatternSize", What: "the size of its regular expressions, in instructions, reaching " + fmt.Sprintf("%q", shorten(pattern, 40)),
			Got: int64(p.total), Max: MaxPatternSize, Fix: "use fewer or smaller patterns: write a{1,900} as a+ with a maxLength"}
	}
	if p.over != nil {
		return nil, p.over
	}
	return regexp.Compile(pattern)
}

// programSize estimates, from above and saturating above MaxPatternSize,
// the instructions re's program takes, without expanding its repetitions.
func programSize(re *syntax.Regexp) int {
	n := 1
	for _, sub := range re.Sub {
		n += programSize(sub)
	}
	if re.Op == syntax.OpRepeat {
		times := max(re.Max, re.Min+1, 1) // Max is -1 for {n,}
		n = min(n*times, MaxPatternSize+1)
	}
	return min(n, MaxPatternSize+1)
}
