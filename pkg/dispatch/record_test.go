package dispatch

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// sameRecord checks that t's record as appendTurn writes it decodes to
// what encoding/json's encoding of t's fields and outcome decodes to, and
// that reading the record gives t back.
func sameRecord(t *testing.T, turn *Turn) {
	t.Helper()
	want, err := json.Marshal(turn.wire())
	if err != nil {
		t.Fatal(err)
	}
	got, err := appendTurn(nil, turn)
	if err != nil {
		t.Fatalf("appendTurn: %v", err)
	}
	testutil.SameJSON(t, want, got)
	var back Turn
	if err := json.Unmarshal(got, &back); err != nil {
		t.Fatalf("reading the record back: %v", err)
	}
	again, err := appendTurn(nil, &back)
	if err != nil {
		t.Fatalf("writing the record read back: %v", err)
	}
	testutil.SameJSON(t, got, again)
}

// filledTurn is a turn with every field set, its outcome's too.
func filledTurn(s string) *Turn {
	turn := &Turn{out: new(TurnOutcome)}
	testutil.Fill(turn, s)
	testutil.Fill(turn.out, s)
	return turn
}

func TestRecordEncodingMatchesJSON(t *testing.T) {
	sameRecord(t, filledTurn("x"))
	// Each state with a lease, and a lease released.
	for _, state := range []TurnState{TurnCollecting, TurnSubmitting, TurnSubmitted, TurnFailed} {
		turn := filledTurn("x")
		turn.State, turn.lease = state, lifecycle.Lease{Owner: "name.1/abc", Until: time.Date(2026, 12, 6, 1, 2, 3, 4, time.UTC), Epoch: 3}
		sameRecord(t, turn)
		turn.lease = lifecycle.Lease{Epoch: 3}
		sameRecord(t, turn)
	}

	// And every optional field left out.
	sameRecord(t, &Turn{Version: protocol.Version, Key: "k", State: TurnCollecting})
	sameRecord(t, &Turn{Calls: []TurnCall{{ID: "c"}}, out: &TurnOutcome{Next: &Ref{}, TimedOut: []protocol.CallKey{}}, Ref: Ref{Agent: &AgentReference{}}, Trace: TraceContext{}})

	// Strings that need escaping: quotes, controls, HTML, line separators
	// and bytes that are not UTF-8.
	for _, s := range []string{`"\`, "\x00\x01\n\r\t\x1f\x7f", "<a>&amp;", "\u2028\u2029", "é€𝄞", "\xff\xfe", "a\xc3", "\xed\xa0\x80"} {
		sameRecord(t, filledTurn(s))
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
		turn := filledTurn(s)
		turn.Calls[0].ID = id
		if json.Valid([]byte(args)) {
			turn.Calls[1].Arguments = json.RawMessage(args)
		}
		sameRecord(t, turn)
	})
}

// A collecting turn carries no outcome, read back or cloned, so the turns
// in flight stay small; a clone's outcome is its own to change.
func TestTurnOutcomeIsHeldOnlyOnceSet(t *testing.T) {
	collecting := &Turn{Version: protocol.Version, Key: "0123456789abcdef0123456789abcdef", State: TurnCollecting,
		Calls: []TurnCall{{ID: "c", Arguments: json.RawMessage(`{}`)}}}
	b, err := appendTurn(nil, collecting)
	if err != nil {
		t.Fatal(err)
	}
	back, err := decodeTurn(b)
	if err != nil {
		t.Fatal(err)
	}
	if back.out != nil {
		t.Errorf("a collecting turn read back holds an outcome: %+v", *back.out)
	}

	claimed := back.clone()
	claimed.writeOutcome().Owner = "one"
	if back.out != nil || claimed.Outcome().Owner != "one" {
		t.Fatalf("claiming the clone changed the original (%v) or not the clone (%q)", back.out, claimed.Outcome().Owner)
	}
	renewed := claimed.clone()
	renewed.writeOutcome().SubmittingSince = time.Now()
	if !claimed.Outcome().SubmittingSince.IsZero() {
		t.Error("renewing a clone's claim changed the claim it was cloned from")
	}

	// Through encoding/json too, as a user of the package would.
	var viaJSON Turn
	if err := json.Unmarshal(mustMarshal(t, claimed), &viaJSON); err != nil || viaJSON.Outcome().Owner != "one" {
		t.Fatalf("json round trip: %v, owner %q", err, viaJSON.Outcome().Owner)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
