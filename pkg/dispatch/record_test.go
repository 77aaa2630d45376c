package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// sameRecord checks that t's record as appendTurn writes it decodes to
// what encoding/json's encoding of t decodes to.
func sameRecord(t *testing.T, turn *Turn) {
	t.Helper()
	want, err := json.Marshal(turn)
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendTurn(nil, turn)
	if err != nil {
		t.Fatalf("appendTurn: %v", err)
	}
	testutil.SameJSON(t, want, got)
}

func TestRecordEncodingMatchesJSON(t *testing.T) {
	var full Turn
	testutil.Fill(&full, "x")
	sameRecord(t, &full)

	// And every optional field left out.
	sameRecord(t, &Turn{Version: protocol.Version, Key: "k", State: TurnCollecting})
	sameRecord(t, &Turn{Calls: []TurnCall{{ID: "c"}}, Next: &Ref{}, Ref: Ref{Agent: &AgentReference{}}, TimedOut: []protocol.CallKey{}, Trace: TraceContext{}})

	// Strings that need escaping: quotes, controls, HTML, line separators
	// and bytes that are not UTF-8.
	for _, s := range []string{`"\`, "\x00\x01\n\r\t\x1f\x7f", "<a>&amp;", "\u2028\u2029", "é€𝄞", "\xff\xfe", "a\xc3", "\xed\xa0\x80"} {
		var turn Turn
		testutil.Fill(&turn, s)
		sameRecord(t, &turn)
	}
}

func TestRecordEncodingRefusesWhatJSONRefuses(t *testing.T) {
	for name, turn := range map[string]*Turn{
		"arguments not JSON": {Calls: []TurnCall{{ID: "c", Arguments: json.RawMessage(`{"a":`)}}},
		"year 10000":         {CreatedAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		if _, err := json.Marshal(turn); err == nil {
			t.Fatalf("%s: encoding/json took it; the case tests nothing", name)
		}
		if _, err := appendTurn(nil, turn); err == nil {
			t.Errorf("%s: appendTurn took it", name)
		}
	}
}

func FuzzRecordEncoding(f *testing.F) {
	f.Add("resp_1", "call_1", `{"order_id":"A-1"}`)
	f.Add("\xff<&>\u2028", "\x00", `[1, "\u00e9", {"a" : null}]`)
	f.Fuzz(func(t *testing.T, s, id, args string) {
		var turn Turn
		testutil.Fill(&turn, s)
		turn.Calls[0].ID = id
		if json.Valid([]byte(args)) {
			turn.Calls[1].Arguments = json.RawMessage(args)
		}
		sameRecord(t, &turn)
	})
}
