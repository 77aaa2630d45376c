package schema

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Bounds on a parameter schema and on the work of checking a call against
// it. A schema is one team's input to a process every team shares: these
// keep the cost of compiling one, and of validating each call, small and
// known, whatever the schema says. A schema over a bound is refused when it
// is declared, with a LimitError naming the bound and how to stay within it.
const (
	// MaxSize bounds a schema as declared, in bytes (the same bound as
	// protocol.MaxParametersSize).
	MaxSize = 64 << 10
	// MaxDepth bounds how deeply a schema's JSON nests: objects and arrays
	// within each other. A level of properties takes two (the keyword's
	// object and the subschema), a level of items one, so 64 allows at
	// least 30 levels of nested parameters.
	MaxDepth = 64
	// MaxNumberDigits bounds the digits of a number written in a schema
	// or in a call's arguments, before any exponent: the validator reads
	// numbers as exact fractions, whose cost grows with their digits.
	MaxNumberDigits = 32
	// MaxExponentDigits bounds the digits of a number's exponent (1e999
	// at most), for the same reason.
	MaxExponentDigits = 3
	// MaxSteps bounds the validation work of one call: the number of
	// times a subschema is applied to a value of the arguments (and the
	// enum values compared). A schema one value of which takes more is
	// refused when declared; arguments that would take more are refused
	// unchecked, with a message saying so.
	MaxSteps = 10_000
	// CompileTimeout bounds the time to compile one schema. Within the
	// bounds above compilation takes milliseconds; this is the backstop.
	CompileTimeout = 2 * time.Second
)

// ErrLimit is wrapped by every LimitError.
var ErrLimit = errors.New("schema: limit exceeded")

// LimitError reports a schema or arguments over one of the bounds above.
type LimitError struct {
	Function string
	Limit    string // the bound's name: "MaxDepth", "MaxSteps", ...
	What     string // what broke it: "nesting", "a number's digits", ...
	At       string // where, as a JSON Pointer into the schema; "" for the whole
	Got, Max int64
	Fix      string // how to bring it within the bound
}

func (e *LimitError) Error() string {
	at := ""
	if e.At != "" {
		at = " at " + shorten(e.At, 120)
	}
	got := fmt.Sprintf("is %d, over", e.Got)
	if e.Got <= e.Max { // a time given up on: how long it would have taken is unknown
		got = "is over"
	}
	return fmt.Sprintf("schema of %s: %s%s %s the limit of %d (%s); %s",
		e.Function, e.What, at, got, e.Max, e.Limit, e.Fix)
}

// Is reports whether target is ErrLimit.
func (e *LimitError) Is(target error) bool { return target == ErrLimit }

func shorten(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// checkLimits checks raw against MaxSize, MaxDepth and the number bounds
// in one pass over its tokens, building nothing, so that a schema over a
// bound costs no more to refuse than to read. It reports malformed JSON
// as the decoder does, and a document with anything after the first value.
func checkLimits(function string, raw []byte) error {
	if len(raw) > MaxSize {
		return &LimitError{Function: function, Limit: "MaxSize", What: "the schema's size in bytes",
			Got: int64(len(raw)), Max: MaxSize, Fix: "describe the parameters more briefly, or split the function"}
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var path pathStack
	for values := 0; ; {
		tok, err := dec.Token()
		if err == io.EOF && values == 1 && len(path) == 0 {
			return nil
		}
		if err == nil && len(path) == 0 {
			if values++; values > 1 {
				err = errors.New("more than one value")
			}
		}
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			return fmt.Errorf("schema of %s: not JSON: %w", function, err)
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{', '[':
				path.push(tok == '{')
				if len(path) > MaxDepth {
					return &LimitError{Function: function, Limit: "MaxDepth", What: "nesting", At: path[:len(path)-1].pointer(),
						Got: int64(len(path)), Max: MaxDepth,
						Fix: "flatten the parameters (fewer arrays of arrays or objects within objects), or take the deep part as a JSON string"}
				}
				continue
			default:
				path.pop()
			}
		case string:
			if path.atKey() {
				path.key(tok)
				continue
			}
		case json.Number:
			if err := checkNumber(function, string(tok), path.pointer()); err != nil {
				return err
			}
		}
		path.next()
	}
}

// checkNumber checks one number as written against MaxNumberDigits and
// MaxExponentDigits; at says where it is.
func checkNumber(function, n, at string) error {
	mantissa, exponent, _ := strings.Cut(strings.ToLower(n), "e")
	digits := int64(len(mantissa) - strings.Count(mantissa, "-") - strings.Count(mantissa, "."))
	if digits > MaxNumberDigits {
		return &LimitError{Function: function, Limit: "MaxNumberDigits", What: "the digits of a number", At: at,
			Got: digits, Max: MaxNumberDigits, Fix: "round it, or write it with an exponent (1.5e40)"}
	}
	exponent = strings.TrimLeft(exponent, "+-")
	if e := int64(len(exponent)); e > MaxExponentDigits {
		return &LimitError{Function: function, Limit: "MaxExponentDigits", What: "the digits of a number's exponent", At: at,
			Got: e, Max: MaxExponentDigits, Fix: "use a number between 1e-999 and 1e999"}
	}
	return nil
}

// pathStack tracks where checkLimits is, to say where a bound is broken.
type pathStack []pathFrame

type pathFrame struct {
	object  bool
	wantKey bool   // in an object, the next string is a key
	key     string // in an object, the current member's key
	index   int    // in an array, the current element's index
}

func (p *pathStack) push(object bool) {
	*p = append(*p, pathFrame{object: object, wantKey: object})
}

func (p *pathStack) pop() {
	*p = (*p)[:len(*p)-1]
	p.next()
}

func (p pathStack) atKey() bool { return len(p) > 0 && p[len(p)-1].object && p[len(p)-1].wantKey }

func (p pathStack) key(k string) {
	p[len(p)-1].key, p[len(p)-1].wantKey = k, false
}

// next moves past a value: to the next key of an object, or the next
// element of an array.
func (p pathStack) next() {
	if len(p) == 0 {
		return
	}
	if f := &p[len(p)-1]; f.object {
		f.wantKey = true
	} else {
		f.index++
	}
}

var pointerEscaper = strings.NewReplacer("~", "~0", "/", "~1")

// pointer is the JSON Pointer of the current value.
func (p pathStack) pointer() string {
	var b strings.Builder
	for _, f := range p {
		switch {
		case f.object && !f.wantKey:
			b.WriteString("/" + pointerEscaper.Replace(f.key))
		case !f.object:
			b.WriteString("/" + strconv.Itoa(f.index))
		}
	}
	return b.String()
}
