package dispatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// A turn record is written three times in its life (taken in, submitting,
// submitted), on every turn's critical path, and encoding/json spent most
// of that time in reflection and in re-validating each time.Time and the
// arguments it had produced. appendTurn writes the same JSON directly.
// Records are read back with encoding/json; TestRecordEncodingMatchesJSON
// holds the two to the same meaning for every field, so a field added to
// Turn, Ref or TurnCall without a line here fails it.

func appendTurn(b []byte, t *Turn) ([]byte, error) {
	var err error
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(t.Version), 10)
	b = appendKey(b, "key", string(t.Key))
	b = append(b, `,"ref":`...)
	b = appendRef(b, &t.Ref)
	b = appendKey(b, "scope", t.Scope)
	b = appendOptional(b, "turn_id", t.TurnID)
	b = appendKey(b, "state", string(t.State))
	b = append(b, `,"calls":`...)
	if t.Calls == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range t.Calls {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendCall(b, &t.Calls[i]); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	for _, f := range [...]struct {
		name string
		at   time.Time
	}{{"created_at", t.CreatedAt}, {"expires_at", t.ExpiresAt}, {"deadline", t.Deadline}} {
		if b, err = appendTime(b, f.name, f.at); err != nil {
			return nil, err
		}
	}
	b = appendOptional(b, "owner", t.Owner)
	for _, f := range [...]struct {
		name string
		at   time.Time
	}{{"submitting_since", t.SubmittingSince}, {"submitted_at", t.SubmittedAt}} {
		if f.at.IsZero() {
			continue // omitzero
		}
		if b, err = appendTime(b, f.name, f.at); err != nil {
			return nil, err
		}
	}
	if t.CutOff {
		b = append(b, `,"cut_off":true`...)
	}
	if len(t.TimedOut) > 0 {
		b = append(b, `,"timed_out":[`...)
		for i, k := range t.TimedOut {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, string(k))
		}
		b = append(b, ']')
	}
	b = appendOptional(b, "error", t.Error)
	if t.Next != nil {
		b = append(b, `,"next":`...)
		b = appendRef(b, t.Next)
	}
	if len(t.Trace) > 0 {
		b = append(b, `,"trace":{`...)
		keys := make([]string, 0, len(t.Trace))
		for k := range t.Trace {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for i, k := range keys {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(appendString(b, k), ':')
			b = appendString(b, t.Trace[k])
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

func appendRef(b []byte, r *Ref) []byte {
	b = append(b, `{"platform":`...)
	b = appendString(b, string(r.Platform))
	b = appendOptional(b, "session_id", r.SessionID)
	b = appendOptional(b, "thread_id", r.ThreadID)
	b = appendOptional(b, "run_id", r.RunID)
	b = appendOptional(b, "response_id", r.ResponseID)
	b = appendOptional(b, "conversation", r.Conversation)
	b = appendOptional(b, "model", r.Model)
	if r.Agent != nil {
		b = append(b, `,"agent":{"name":`...)
		b = appendString(b, r.Agent.Name)
		b = appendOptional(b, "version", r.Agent.Version)
		b = append(b, '}')
	}
	if r.Background {
		b = append(b, `,"background":true`...)
	}
	return append(b, '}')
}

func appendCall(b []byte, c *TurnCall) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = appendString(b, c.ID)
	b = appendKey(b, "name", c.Name)
	b = appendKey(b, "key", string(c.Key))
	b = appendKey(b, "team", c.Team)
	b = append(b, `,"arguments":`...)
	if c.Arguments == nil {
		b = append(b, "null"...)
	} else {
		// As encoding/json does: the arguments compacted, and refused
		// unless they are JSON (intake keeps nothing else).
		buf := bytes.NewBuffer(b)
		if err := json.Compact(buf, c.Arguments); err != nil {
			return nil, errors.New("dispatch: encode turn record: the arguments of call " + strconv.Quote(c.ID) + " are not JSON")
		}
		b = buf.Bytes()
	}
	if c.Rejected {
		b = append(b, `,"rejected":true`...)
	}
	return append(b, '}'), nil
}

// appendKey appends ,"name":"value".
func appendKey(b []byte, name, value string) []byte {
	b = append(append(append(b, `,"`...), name...), `":`...)
	return appendString(b, value)
}

// appendOptional is appendKey for an omitempty field.
func appendOptional(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	return appendKey(b, name, value)
}

// appendTime appends ,"name":t as encoding/json writes a time (RFC 3339
// with nanoseconds, refusing years it cannot write).
func appendTime(b []byte, name string, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y >= 10000 {
		return nil, errors.New("dispatch: encode turn record: " + name + ": year outside of range [0,9999]")
	}
	b = append(append(append(b, `,"`...), name...), `":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// appendString appends s as a JSON string. It decodes to what
// encoding/json's encoding of s decodes to: bytes that are not UTF-8
// become U+FFFD.
func appendString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, `\n`...)
			case '\r':
				b = append(b, `\r`...)
			case '\t':
				b = append(b, `\t`...)
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
