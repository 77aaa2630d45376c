package protocol

import (
	"encoding/json"
	"math"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// A fast path for decoding the envelopes toolrelay writes (the call and the
// result), beside encoding/json. It takes only what it decodes exactly as
// encoding/json does: one JSON object of the envelope's own keys, each at
// most once and spelled as written, with values of the expected kinds.
// Anything else (a key in another case or unknown, a repeated key, null,
// a number that is not a plain integer, an escape it does not handle,
// invalid UTF-8, trailing bytes) makes it give up, and the caller decodes
// with encoding/json, which then gives what it always gave, errors
// included. The fuzz tests hold it to that.

// reader walks one JSON text; ok turns false at the first thing it does
// not take, after which every method is a no-op.
type reader struct {
	b  []byte
	i  int
	ok bool
}

func newReader(b []byte) *reader { return &reader{b: b, ok: true} }

func (r *reader) fail() { r.ok = false }

func (r *reader) space() {
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ' ', '\t', '\n', '\r':
			r.i++
		default:
			return
		}
	}
}

// next skips space and reports whether c comes next, taking it if so.
func (r *reader) next(c byte) bool {
	r.space()
	if r.ok && r.i < len(r.b) && r.b[r.i] == c {
		r.i++
		return true
	}
	return false
}

// object reads an object, calling value for each key with the reader at
// the key's value, which value must read. Keys must be plain ASCII without
// escapes, each at most once, and among allowed (bits of keyBit).
func (r *reader) object(allowed uint, value func(bit uint)) {
	if !r.next('{') {
		r.fail()
		return
	}
	if r.next('}') {
		return
	}
	var seen uint
	for r.ok {
		r.space()
		key := r.plainString()
		bit := uint(0)
		if r.ok {
			bit = keyBit(key) & allowed
		}
		if bit == 0 || seen&bit != 0 || !r.next(':') {
			r.fail()
			return
		}
		seen |= bit
		r.space()
		value(bit)
		if r.next(',') {
			continue
		}
		if !r.next('}') {
			r.fail()
		}
		return
	}
}

// end checks that only space follows.
func (r *reader) end() {
	r.space()
	if r.i != len(r.b) {
		r.fail()
	}
}

// plainString reads a string of printable ASCII without escapes and
// returns its bytes, aliasing the input.
func (r *reader) plainString() []byte {
	if !r.ok || r.i >= len(r.b) || r.b[r.i] != '"' {
		r.fail()
		return nil
	}
	start := r.i + 1
	for j := start; j < len(r.b); j++ {
		switch c := r.b[j]; {
		case c == '"':
			r.i = j + 1
			return r.b[start:j]
		case c < 0x20 || c == '\\' || c >= utf8.RuneSelf:
			r.fail()
			return nil
		}
	}
	r.fail()
	return nil
}

// string reads a string value: valid UTF-8, with the escapes JSON has;
// a \u escape of half a surrogate pair, alone, is left to encoding/json.
func (r *reader) string() string {
	if !r.ok || r.i >= len(r.b) || r.b[r.i] != '"' {
		r.fail()
		return ""
	}
	start := r.i + 1
	j := start
	for j < len(r.b) && r.b[j] != '"' && r.b[j] != '\\' && r.b[j] >= 0x20 {
		j++
	}
	if j < len(r.b) && r.b[j] == '"' { // no escapes: most strings
		s := r.b[start:j]
		if !utf8.Valid(s) {
			r.fail()
			return ""
		}
		r.i = j + 1
		return string(s)
	}
	out := make([]byte, 0, j-start+16)
	out = append(out, r.b[start:j]...)
	for j < len(r.b) {
		c := r.b[j]
		switch {
		case c == '"':
			if !utf8.Valid(out) {
				r.fail()
				return ""
			}
			r.i = j + 1
			return string(out)
		case c < 0x20:
			r.fail()
			return ""
		case c != '\\':
			out = append(out, c)
			j++
			continue
		}
		if j+1 >= len(r.b) {
			break
		}
		switch e := r.b[j+1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			rn, n := r.unicodeEscape(j)
			if n == 0 {
				r.fail()
				return ""
			}
			out = utf8.AppendRune(out, rn)
			j += n
			continue
		default:
			r.fail()
			return ""
		}
		j += 2
	}
	r.fail()
	return ""
}

// unicodeEscape reads the \uXXXX escape at j (a surrogate pair as one
// rune); n is the bytes it takes, 0 if it is not one this path takes.
func (r *reader) unicodeEscape(j int) (rune, int) {
	rn, ok := hex4(r.b, j+2)
	if !ok {
		return 0, 0
	}
	if !utf16.IsSurrogate(rn) {
		return rn, 6
	}
	if j+12 > len(r.b) || r.b[j+6] != '\\' || r.b[j+7] != 'u' {
		return 0, 0
	}
	lo, ok := hex4(r.b, j+8)
	if !ok {
		return 0, 0
	}
	if dec := utf16.DecodeRune(rn, lo); dec != utf8.RuneError {
		return dec, 12
	}
	return 0, 0
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	var v rune
	for _, c := range b[at : at+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | rune(c)
	}
	return v, true
}

// int reads a non-negative integer written plainly (no sign, fraction or
// exponent, no leading zero), small enough for an int.
func (r *reader) int() int {
	if !r.ok {
		return 0
	}
	start, v := r.i, 0
	for r.i < len(r.b) && '0' <= r.b[r.i] && r.b[r.i] <= '9' {
		if v > (math.MaxInt32-9)/10 { // fits an int on any platform
			r.fail()
			return 0
		}
		v = v*10 + int(r.b[r.i]-'0')
		r.i++
	}
	n := r.i - start
	if n == 0 || (n > 1 && r.b[start] == '0') || (r.i < len(r.b) && (r.b[r.i] == '.' || r.b[r.i] == 'e' || r.b[r.i] == 'E')) {
		r.fail()
		return 0
	}
	return v
}

// time reads a time as encoding/json does: its string, raw, to
// time.Time's UnmarshalJSON.
func (r *reader) time() time.Time {
	if !r.ok || r.i >= len(r.b) || r.b[r.i] != '"' {
		r.fail()
		return time.Time{}
	}
	start := r.i
	r.plainString()
	var t time.Time
	if r.ok && t.UnmarshalJSON(r.b[start:r.i]) != nil {
		r.fail()
	}
	return t
}

// raw reads any JSON value but null and returns a copy of its bytes, as
// encoding/json fills a json.RawMessage.
func (r *reader) raw() json.RawMessage {
	if !r.ok || r.i >= len(r.b) || r.b[r.i] == 'n' {
		r.fail()
		return nil
	}
	start, depth := r.i, 0
	for r.i < len(r.b) {
		c := r.b[r.i]
		switch {
		case c == '"':
			r.skipString()
			if !r.ok {
				return nil
			}
			if depth == 0 {
				return r.copyValid(start)
			}
			continue
		case c == '{' || c == '[':
			depth++
		case c == '}' || c == ']':
			depth--
			if depth < 0 {
				r.fail()
				return nil
			}
			if depth == 0 {
				r.i++
				return r.copyValid(start)
			}
		case depth == 0 && (c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return r.copyValid(start) // the end of a number or literal
		}
		r.i++
	}
	r.fail()
	return nil
}

func (r *reader) skipString() {
	for j := r.i + 1; j < len(r.b); j++ {
		switch r.b[j] {
		case '\\':
			j++
		case '"':
			r.i = j + 1
			return
		}
	}
	r.fail()
}

func (r *reader) copyValid(start int) json.RawMessage {
	v := r.b[start:r.i]
	if !json.Valid(v) {
		r.fail()
		return nil
	}
	return append(json.RawMessage(nil), v...)
}

// Bits of the envelopes' keys, for the reader's repeated-key check.
const (
	keyV uint = 1 << iota
	keyKey
	keyPlatform
	keyScope
	keyCallID
	keyTeam
	keyFunction
	keyArguments
	keyDeadline
	keyCreatedAt
	keyOutput
	keyError
	keyExecutor
	keyAttempt
	keyStartedAt
	keyFinishedAt
	keyType
	keyMessage
	keyFormat
	keyKeepResultUntil
)

// The keys each object may have.
const (
	callFields = keyV | keyKey | keyPlatform | keyScope | keyCallID | keyTeam | keyFunction |
		keyArguments | keyFormat | keyDeadline | keyCreatedAt | keyKeepResultUntil
	resultFields = keyV | keyKey | keyCallID | keyTeam | keyFunction | keyOutput | keyError |
		keyExecutor | keyAttempt | keyStartedAt | keyFinishedAt
	errorFields = keyType | keyMessage
)

// keyBit is the bit of an envelope key, as the envelopes spell it; 0 for
// any other key.
func keyBit(k []byte) uint {
	switch string(k) {
	case "v":
		return keyV
	case "key":
		return keyKey
	case "platform":
		return keyPlatform
	case "scope":
		return keyScope
	case "call_id":
		return keyCallID
	case "team":
		return keyTeam
	case "function":
		return keyFunction
	case "arguments":
		return keyArguments
	case "deadline":
		return keyDeadline
	case "created_at":
		return keyCreatedAt
	case "output":
		return keyOutput
	case "error":
		return keyError
	case "executor":
		return keyExecutor
	case "attempt":
		return keyAttempt
	case "started_at":
		return keyStartedAt
	case "finished_at":
		return keyFinishedAt
	case "type":
		return keyType
	case "message":
		return keyMessage
	case "format":
		return keyFormat
	case "keep_result_until":
		return keyKeepResultUntil
	}
	return 0
}

// readCall decodes data into c on the fast path; false: not taken.
func readCall(data []byte, c *Call) bool {
	r := newReader(data)
	r.object(callFields, func(bit uint) {
		switch bit {
		case keyV:
			c.Version = r.int()
		case keyKey:
			c.Key = CallKey(r.string())
		case keyPlatform:
			c.Platform = Platform(r.string())
		case keyScope:
			c.Scope = r.string()
		case keyCallID:
			c.CallID = r.string()
		case keyTeam:
			c.Team = r.string()
		case keyFunction:
			c.Function = r.string()
		case keyArguments:
			c.Arguments = r.raw()
		case keyFormat:
			c.Format = r.string()
		case keyDeadline:
			c.Deadline = r.time()
		case keyCreatedAt:
			c.CreatedAt = r.time()
		case keyKeepResultUntil:
			c.KeepResultUntil = r.time()
		}
	})
	r.end()
	return r.ok
}

// readResult decodes data into res on the fast path; false: not taken.
func readResult(data []byte, res *Result) bool {
	r := newReader(data)
	r.object(resultFields, func(bit uint) {
		switch bit {
		case keyV:
			res.Version = r.int()
		case keyKey:
			res.Key = CallKey(r.string())
		case keyCallID:
			res.CallID = r.string()
		case keyTeam:
			res.Team = r.string()
		case keyFunction:
			res.Function = r.string()
		case keyOutput:
			res.Output = r.string()
		case keyError:
			e := &CallError{}
			r.object(errorFields, func(bit uint) {
				if bit == keyType {
					e.Code = ErrorCode(r.string())
				} else {
					e.Message = r.string()
				}
			})
			res.Error = e
		case keyExecutor:
			res.Executor = r.string()
		case keyAttempt:
			res.Attempt = r.int()
		case keyStartedAt:
			res.StartedAt = r.time()
		case keyFinishedAt:
			res.FinishedAt = r.time()
		}
	})
	r.end()
	return r.ok
}
