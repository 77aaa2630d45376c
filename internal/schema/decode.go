package schema

import (
	"encoding/json"
	"errors"
	"unicode/utf8"
)

// decode reads one JSON document into the values the validator takes:
// map[string]any, []any, string, json.Number, bool and nil, as
// jsonschema.UnmarshalJSON does (encoding/json with UseNumber, nothing
// but white space after the value). Every call's arguments are checked,
// and that decoder's scanning twice (once to find the value, once to
// read it) and its per-value bookkeeping were most of a check's cost.
//
// It reads well-formed documents only: at anything else it reports
// errMalformed, and Check asks encoding/json for the error to show, so
// malformed arguments are described exactly as before. A string with an
// escape or a byte outside ASCII is unquoted by encoding/json too, so
// strings read the same, invalid UTF-8 and lone surrogates included.
func decode(data []byte) (any, error) {
	d := decoder{data: data}
	d.space()
	v, ok := d.value(0)
	d.space()
	if !ok || d.i != len(d.data) {
		return nil, errMalformed
	}
	return v, nil
}

var errMalformed = errors.New("schema: malformed JSON")

// maxDepth is encoding/json's nesting limit: a document it refuses for
// depth is refused here too, before recursion can cost much stack.
const maxDepth = 10000

type decoder struct {
	data []byte
	i    int
}

func (d *decoder) space() {
	for d.i < len(d.data) {
		switch d.data[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

func (d *decoder) value(depth int) (any, bool) {
	if d.i >= len(d.data) {
		return nil, false
	}
	switch c := d.data[d.i]; {
	case c == '{':
		return d.object(depth + 1)
	case c == '[':
		return d.array(depth + 1)
	case c == '"':
		s, ok := d.string()
		return s, ok
	case c == '-' || ('0' <= c && c <= '9'):
		return d.number()
	default:
		return d.literal()
	}
}

func (d *decoder) object(depth int) (any, bool) {
	if depth > maxDepth {
		return nil, false
	}
	d.i++ // {
	m := map[string]any{}
	d.space()
	if d.i < len(d.data) && d.data[d.i] == '}' {
		d.i++
		return m, true
	}
	for {
		if d.i >= len(d.data) || d.data[d.i] != '"' {
			return nil, false
		}
		k, ok := d.string()
		if !ok {
			return nil, false
		}
		d.space()
		if d.i >= len(d.data) || d.data[d.i] != ':' {
			return nil, false
		}
		d.i++
		d.space()
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		m[k] = v // a repeated key: the last one wins, as in encoding/json
		d.space()
		if d.i >= len(d.data) {
			return nil, false
		}
		switch d.data[d.i] {
		case ',':
			d.i++
			d.space()
		case '}':
			d.i++
			return m, true
		default:
			return nil, false
		}
	}
}

func (d *decoder) array(depth int) (any, bool) {
	if depth > maxDepth {
		return nil, false
	}
	d.i++ // [
	a := []any{}
	d.space()
	if d.i < len(d.data) && d.data[d.i] == ']' {
		d.i++
		return a, true
	}
	for {
		v, ok := d.value(depth)
		if !ok {
			return nil, false
		}
		a = append(a, v)
		d.space()
		if d.i >= len(d.data) {
			return nil, false
		}
		switch d.data[d.i] {
		case ',':
			d.i++
			d.space()
		case ']':
			d.i++
			return a, true
		default:
			return nil, false
		}
	}
}

// string reads a quoted string at d.i.
func (d *decoder) string() (string, bool) {
	start := d.i
	d.i++ // "
	plain := true
	for d.i < len(d.data) {
		switch c := d.data[d.i]; {
		case c == '"':
			d.i++
			if plain {
				return string(d.data[start+1 : d.i-1]), true
			}
			var s string
			if json.Unmarshal(d.data[start:d.i], &s) != nil {
				return "", false
			}
			return s, true
		case c == '\\':
			plain = false
			d.i += 2 // the escape's first character is never a quote that ends the string
		case c < 0x20:
			return "", false
		case c >= utf8.RuneSelf:
			plain = false
			d.i++
		default:
			d.i++
		}
	}
	return "", false
}

// number reads a number at d.i, kept as written (json.Number).
func (d *decoder) number() (any, bool) {
	start := d.i
	if d.data[d.i] == '-' {
		d.i++
	}
	switch {
	case d.i < len(d.data) && d.data[d.i] == '0':
		d.i++
	case d.digits() == 0:
		return nil, false
	}
	if d.i < len(d.data) && d.data[d.i] == '.' {
		d.i++
		if d.digits() == 0 {
			return nil, false
		}
	}
	if d.i < len(d.data) && (d.data[d.i] == 'e' || d.data[d.i] == 'E') {
		d.i++
		if d.i < len(d.data) && (d.data[d.i] == '+' || d.data[d.i] == '-') {
			d.i++
		}
		if d.digits() == 0 {
			return nil, false
		}
	}
	return json.Number(d.data[start:d.i]), true
}

func (d *decoder) digits() int {
	n := 0
	for d.i < len(d.data) && '0' <= d.data[d.i] && d.data[d.i] <= '9' {
		d.i++
		n++
	}
	return n
}

func (d *decoder) literal() (any, bool) {
	for _, l := range [...]struct {
		text  string
		value any
	}{{"true", true}, {"false", false}, {"null", nil}} {
		if len(d.data)-d.i >= len(l.text) && string(d.data[d.i:d.i+len(l.text)]) == l.text {
			d.i += len(l.text)
			return l.value, true
		}
	}
	return nil, false
}
