package protocol

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// Strings that need escaping: quotes, controls, HTML, line separators and
// bytes that are not UTF-8.
var awkwardStrings = []string{"plain", `"\`, "\x00\x01\n\r\t\x1f\x7f", "<a>&amp;", "\u2028\u2029", "é€𝄞", "\xff\xfe", "a\xc3", "\xed\xa0\x80"}

// The call and result envelopes written by hand read back as what
// encoding/json writes, for every field (filled by reflection, so a field
// added later without a line in the encoder fails this), every optional
// field left out, and strings that need escaping.
func TestEnvelopeEncodingMatchesJSON(t *testing.T) {
	for _, s := range awkwardStrings {
		var c Call
		testutil.Fill(&c, s)
		sameEnvelope(t, &c, appendCall)
		var r Result
		testutil.Fill(&r, s)
		sameEnvelope(t, &r, appendResult)
	}
	sameEnvelope(t, &Call{}, appendCall)
	sameEnvelope(t, &Result{}, appendResult)
	sameEnvelope(t, &Result{Error: &CallError{}}, appendResult)
}

func sameEnvelope[T any](t *testing.T, v *T, encode func([]byte, *T) ([]byte, error)) {
	t.Helper()
	want, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	got, err := encode(nil, v)
	if err != nil {
		t.Fatalf("by hand: %v", err)
	}
	testutil.SameJSON(t, want, got)
}

func TestEnvelopeEncodingRefusesWhatJSONRefuses(t *testing.T) {
	year := time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)
	zone := time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*60*60))
	for name, c := range map[string]*Call{"arguments not JSON": {Arguments: json.RawMessage(`{"a":`)}, "year 10000": {Deadline: year},
		"offset of a day": {CreatedAt: zone}} {
		if _, err := json.Marshal(c); err == nil {
			t.Fatalf("%s: encoding/json took it; the case tests nothing", name)
		}
		if _, err := appendCall(nil, c); err == nil {
			t.Errorf("call, %s: the encoder took it", name)
		}
	}
	if _, err := appendResult(nil, &Result{FinishedAt: year}); err == nil {
		t.Error("result, year 10000: the encoder took it")
	}
}

func FuzzEnvelopeEncoding(f *testing.F) {
	f.Add("resp_1", `{"order_id":"A-1"}`, "output")
	f.Add("\xff<&>\u2028", `[1, "\u00e9", {"a" : null}]`, "\x00")
	f.Fuzz(func(t *testing.T, s, args, out string) {
		var c Call
		testutil.Fill(&c, s)
		if json.Valid([]byte(args)) {
			c.Arguments = json.RawMessage(args)
		}
		sameEnvelope(t, &c, appendCall)
		var r Result
		testutil.Fill(&r, s)
		r.Output = out
		sameEnvelope(t, &r, appendResult)
	})
}
