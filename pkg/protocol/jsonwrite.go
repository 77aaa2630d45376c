package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"time"
	"unicode/utf8"
)

// The envelopes on every call's path (a call, its result, the
// dispatcher's turn record) are written by hand: encoding/json spent most
// of their encoding in reflection and in re-validating the time.Time and
// raw-JSON output it had just produced. What they write reads back with
// encoding/json as what encoding/json would have written; the tests hold
// each encoder to that for every field.

// AppendJSONString appends s as a JSON string. It decodes to what
// encoding/json's encoding of s decodes to: bytes that are not UTF-8
// become U+FFFD.
func AppendJSONString(b []byte, s string) []byte {
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

// AppendJSONField appends ,"name":"value".
func AppendJSONField(b []byte, name, value string) []byte {
	b = append(append(append(b, `,"`...), name...), `":`...)
	return AppendJSONString(b, value)
}

// AppendJSONOptional is AppendJSONField for an omitempty field: nothing
// when value is empty.
func AppendJSONOptional(b []byte, name, value string) []byte {
	if value == "" {
		return b
	}
	return AppendJSONField(b, name, value)
}

// AppendJSONTime appends ,"name":t as encoding/json writes a time (RFC
// 3339 with nanoseconds), refusing what it refuses: years outside 0-9999
// and zone offsets of a day or more.
func AppendJSONTime(b []byte, name string, t time.Time) ([]byte, error) {
	if y := t.Year(); y < 0 || y >= 10000 {
		return nil, errors.New(name + ": year outside of range [0,9999]")
	}
	if _, off := t.Zone(); off <= -24*60*60 || off >= 24*60*60 {
		return nil, errors.New(name + ": timezone hour outside of range [0,23]")
	}
	b = append(append(append(b, `,"`...), name...), `":"`...)
	b = t.AppendFormat(b, time.RFC3339Nano)
	return append(b, '"'), nil
}

// AppendJSONRaw appends raw JSON compacted, as encoding/json writes a
// json.RawMessage (null when raw is nil); it refuses raw that is not JSON.
func AppendJSONRaw(b []byte, raw json.RawMessage) ([]byte, error) {
	if raw == nil {
		return append(b, "null"...), nil
	}
	buf := bytes.NewBuffer(b)
	if err := json.Compact(buf, raw); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
