package protocol

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// What the encoders write, the fast path reads, and reads as
// encoding/json does: every field (filled by reflection, so a field added
// later without a line in the reader fails this) and strings that need
// escaping.
func TestTheFastPathReadsWhatTheEncodersWrite(t *testing.T) {
	for _, s := range awkwardStrings {
		var c Call
		testutil.Fill(&c, s)
		b, err := appendCall(nil, &c)
		if err != nil {
			t.Fatal(err)
		}
		var got Call
		if !readCall(b, &got) {
			t.Errorf("the fast path gave up on a call the encoder wrote: %s", b)
		}
		agrees(t, b, &got)

		var r Result
		testutil.Fill(&r, s)
		r.Output = s + `{"status":"shipped"}`
		if b, err = appendResult(nil, &r); err != nil {
			t.Fatal(err)
		}
		var gotR Result
		if !readResult(b, &gotR) {
			t.Errorf("the fast path gave up on a result the encoder wrote: %s", b)
		}
		agrees(t, b, &gotR)
	}
}

// agrees checks that got, read by the fast path from data, is what
// encoding/json reads from it.
func agrees[T any](t *testing.T, data []byte, got *T) {
	t.Helper()
	var want T
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatalf("the fast path took what encoding/json refuses (%v): %q", err, data)
	}
	if !reflect.DeepEqual(got, &want) {
		t.Fatalf("the fast path read %q as\n%+v\nencoding/json as\n%+v", data, got, &want)
	}
}

// Inputs encoding/json reads in its own way (keys in another case, a
// repeated key, null, numbers and escapes the fast path leaves alone) are
// decoded as before: the fast path gives them up.
func TestTheFastPathLeavesTheRestToEncodingJSON(t *testing.T) {
	good, err := EncodeCall(sampleCall())
	if err != nil {
		t.Fatal(err)
	}
	for _, data := range []string{
		`{"KEY":"x"}`, `{"v":1,"v":2}`, `{"v":null}`, `{"v":1.0}`, `{"v":-1}`, `{"v":01}`,
		`{"scope":"\ud800"}`, `{"scope":"\ud83d\u0041"}`, `{"scope":"\xff"}`, `{"unknown":1}`,
		`{"arguments":null}`, `{"deadline":"2026-01-01T00:00:00\u005a"}`, `{"v":1} x`, `{"v":1,}`,
		"{\"scope\":\"\xff\"}", `[]`, ``, `"s"`, string(good) + `,`,
	} {
		var c Call
		if readCall([]byte(data), &c) {
			t.Errorf("the fast path took %q", data)
		}
	}
	// Still decoded as encoding/json decodes them.
	var viaJSON Call
	_ = json.Unmarshal([]byte(`{"V":1,"v":2,"Scope":"a","scope":"b"}`), &viaJSON)
	var c Call
	if err := decodeEnvelope([]byte(`{"V":1,"v":2,"Scope":"a","scope":"b"}`), &c, readCall); err != nil || !reflect.DeepEqual(c, viaJSON) {
		t.Errorf("decodeEnvelope = %+v, %v; want encoding/json's %+v", c, err, viaJSON)
	}
}

func FuzzFastCallAgreesWithEncodingJSON(f *testing.F) {
	good, _ := EncodeCall(sampleCall())
	f.Add(good)
	f.Add([]byte(` { "v" : 1 , "scope" : "a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00" , "arguments" : [1, {"a": "]"}] } `))
	f.Add([]byte(`{"arguments":12,"v":0}`))
	f.Add([]byte(`{"arguments":"x","deadline":"2026-01-01T00:00:00+02:00"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c Call
		if readCall(data, &c) {
			agrees(t, data, &c)
		}
	})
}

func FuzzFastResultAgreesWithEncodingJSON(f *testing.F) {
	for _, r := range sampleResults() {
		b, _ := EncodeResult(r)
		f.Add(b)
	}
	f.Add([]byte(`{"error":{"type":"timeout","message":"\u2028"},"attempt":3,"output":""}`))
	f.Add([]byte(`{"error":{},"v":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r Result
		if readResult(data, &r) {
			agrees(t, data, &r)
		}
	})
}

// The envelopes' decoders beside encoding/json alone, on what the
// encoders write: go test -bench Decode ./pkg/protocol
func BenchmarkDecode(b *testing.B) {
	call, _ := EncodeCall(sampleCall())
	res := sampleResults()["result_ok"]
	res.Output = `{"status":"shipped","order_id":"A-1001","eta":"2026-01-02"}`
	result, _ := EncodeResult(res)
	for _, c := range []struct {
		name string
		run  func() error
	}{
		{"call", func() error { _, err := DecodeCall(call); return err }},
		{"call/encoding_json", func() error { var c Call; return json.Unmarshal(call, &c) }},
		{"result", func() error { _, err := DecodeResult(result); return err }},
		{"result/encoding_json", func() error { var r Result; return json.Unmarshal(result, &r) }},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := c.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
