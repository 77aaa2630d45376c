package protocol

import (
	"bytes"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
)

// The fuzz targets check that decoders never panic, and that whatever they
// accept encodes back to an envelope they accept again, unchanged.

func FuzzDecodeCall(f *testing.F) {
	good, _ := EncodeCall(sampleCall())
	f.Add(good)
	f.Add([]byte(`{"v":1}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := DecodeCall(data)
		if err != nil {
			return
		}
		b, err := EncodeCall(c)
		if err != nil {
			t.Fatalf("accepted call does not re-encode: %v", err)
		}
		c2, err := DecodeCall(b)
		if err != nil {
			t.Fatalf("re-encoded call rejected: %v", err)
		}
		b2, _ := EncodeCall(c2)
		if !bytes.Equal(b, b2) {
			t.Fatalf("not stable:\n%s\n%s", b, b2)
		}
	})
}

func FuzzDecodeResult(f *testing.F) {
	for _, r := range sampleResults() {
		b, _ := EncodeResult(r)
		f.Add(b)
	}
	f.Add([]byte(`{"v":1,"error":{"type":"timeout"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := DecodeResult(data)
		if err != nil {
			return
		}
		b, err := EncodeResult(r)
		if err != nil {
			t.Fatalf("accepted result does not re-encode: %v", err)
		}
		if _, err := DecodeResult(b); err != nil {
			t.Fatalf("re-encoded result rejected: %v", err)
		}
		if !json.Valid([]byte(r.ModelOutput())) && !r.OK() {
			t.Fatalf("failure output is not JSON: %s", r.ModelOutput())
		}
	})
}

func FuzzDecodeFunctionSpec(f *testing.F) {
	f.Add([]byte(`{"v":1,"name":"f","team":"t","parameters":{"type":"object"},"timeout":"5s","updated_at":"2026-01-01T00:00:00Z"}`))
	f.Add([]byte(`{"v":1,"name":"f","team":"t","parameters":{"type":"object"},"approval":{"when":"args.amount > 100","approvers":["admin","alice@x"]},"updated_at":"2026-01-01T00:00:00Z"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeFunctionSpec(data)
		if err != nil {
			return
		}
		b, err := EncodeFunctionSpec(s)
		if err != nil {
			t.Fatalf("accepted spec does not re-encode: %v", err)
		}
		if _, err := DecodeFunctionSpec(b); err != nil {
			t.Fatalf("re-encoded spec rejected: %v", err)
		}
	})
}

func FuzzParseCallSubject(f *testing.F) {
	f.Add("fncall.payments.issue_refund")
	f.Add("fncall.a.b.c")
	f.Fuzz(func(t *testing.T, s string) {
		team, fn, err := ParseCallSubject(s)
		if err != nil {
			return
		}
		if got := CallSubject(team, fn); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
	})
}

func FuzzParseResultSubject(f *testing.F) {
	key := NewTurnKey(PlatformAgents, "s", []string{"c"}).Call("c")
	f.Add(ResultSubject("geo", key))
	f.Add(ResultSubject(SystemTeam, key))
	f.Add("fnresult.geo.x.y")
	f.Fuzz(func(t *testing.T, s string) {
		team, k, err := ParseResultSubject(s)
		if err != nil {
			return
		}
		if got := ResultSubject(team, k); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
		if k.Turn().Validate() != nil {
			t.Fatalf("accepted key %q has an invalid turn", k)
		}
	})
}

func FuzzParseCallKey(f *testing.F) {
	f.Add(string(NewTurnKey(PlatformAgents, "s", []string{"c"}).Call("c")))
	f.Add("0123.4567")
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseCallKey(s)
		if err != nil {
			return
		}
		if string(k.Turn())+"."+s[len(k.Turn())+1:] != s {
			t.Fatalf("Turn() of %q is %q", s, k.Turn())
		}
	})
}

func FuzzTruncate(f *testing.F) {
	f.Add("hello world", 5)
	f.Add("ééééé", 3)
	f.Fuzz(func(t *testing.T, s string, limit int) {
		if limit < 0 || limit > 1<<20 {
			return
		}
		got := Truncate(s, limit)
		if len(s) <= limit && got != s {
			t.Fatalf("fitting input changed")
		}
		if len(got) > max(limit, 0) && len(s) > limit {
			t.Fatalf("len %d > limit %d", len(got), limit)
		}
	})
}

func FuzzDecodeDeadLetter(f *testing.F) {
	c := sampleCall()
	dl := &DeadLetter{Version: Version, Call: c, Result: sampleResults()["result_failed"], Reason: ReasonPanic, Attempts: 1, At: c.CreatedAt}
	b, err := EncodeDeadLetter(dl)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := DecodeDeadLetter(data)
		if err != nil {
			return
		}
		b, err := EncodeDeadLetter(d)
		if err != nil {
			t.Fatalf("accepted dead letter does not re-encode: %v", err)
		}
		if _, err := DecodeDeadLetter(b); err != nil {
			t.Fatalf("re-encoded dead letter rejected: %v", err)
		}
	})
}

func FuzzParseCancelSubject(f *testing.F) {
	f.Add(CancelSubject("geo", NewTurnKey(PlatformAgents, "s", []string{"c"})))
	f.Add("fncancel.a.b")
	f.Fuzz(func(t *testing.T, s string) {
		team, turn, err := ParseCancelSubject(s)
		if err != nil {
			return
		}
		if got := CancelSubject(team, turn); got != s {
			t.Fatalf("round trip %q -> %q", s, got)
		}
	})
}

// FuzzNamesMatchPatterns checks the byte-level name checks against the
// documented patterns.
func FuzzNamesMatchPatterns(f *testing.F) {
	fnRE := regexp.MustCompile(FunctionNamePattern)
	teamRE := regexp.MustCompile(TeamNamePattern)
	for _, s := range []string{"get_weather", "_x", "-x", "A", "a.b", "", strings.Repeat("a", 65), "ü"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := ValidateFunctionName(s) == nil, fnRE.MatchString(s); got != want {
			t.Fatalf("function %q: check %v, pattern %v", s, got, want)
		}
		if got, want := ValidateTeamName(s) == nil, teamRE.MatchString(s); got != want {
			t.Fatalf("team %q: check %v, pattern %v", s, got, want)
		}
	})
}

func FuzzDecodeDeclareRequest(f *testing.F) {
	f.Add("orders", []byte(`{"v":1,"op":"declare","declarations":[{"v":1,"instance":"i","started_at":"2026-01-01T00:00:00Z","spec":{"v":1,"name":"f","team":"orders","parameters":{"type":"object"},"updated_at":"2026-01-01T00:00:00Z"}}]}`))
	f.Add("orders", []byte(`{"v":1,"op":"withdraw","declarations":[]}`))
	f.Fuzz(func(t *testing.T, team string, data []byte) {
		r, err := DecodeDeclareRequest(team, data)
		if err != nil {
			return
		}
		// An accepted request is of the subject's team alone, and
		// survives a round trip.
		for _, d := range r.Declarations {
			if d.Spec.Team != team {
				t.Fatalf("declaration of team %q accepted on team %q's subject", d.Spec.Team, team)
			}
			if _, _, _, err := ParseDeclarationKey(d.Key()); err != nil {
				t.Fatalf("accepted declaration has a bad key %q: %v", d.Key(), err)
			}
		}
		b, err := EncodeDeclareRequest(team, r)
		if err != nil {
			t.Fatalf("accepted request does not re-encode: %v", err)
		}
		if _, err := DecodeDeclareRequest(team, b); err != nil {
			t.Fatalf("re-encoded request rejected: %v", err)
		}
	})
}

func FuzzParseDeclareSubject(f *testing.F) {
	f.Add("toolrelay.declare.orders")
	f.Add("toolrelay.declare.a.b")
	f.Fuzz(func(t *testing.T, subject string) {
		team, err := ParseDeclareSubject(subject)
		if err != nil {
			return
		}
		if DeclareSubject(team) != subject {
			t.Fatalf("ParseDeclareSubject(%q) = %q, which does not round-trip", subject, team)
		}
	})
}

// Every well-formed result subject is read back as the team and key it was
// made of.
func FuzzResultSubjectOfValidParts(f *testing.F) {
	key := NewTurnKey(PlatformAgents, "s", []string{"c"}).Call("c")
	f.Add("geo", string(key))
	f.Add(SystemTeam, string(key))
	f.Add("a.b", string(key))
	f.Fuzz(func(t *testing.T, team, k string) {
		if validResultTeam(team) != nil || CallKey(k).Validate() != nil {
			return
		}
		gotTeam, gotKey, err := ParseResultSubject(ResultSubject(team, CallKey(k)))
		if err != nil || gotTeam != team || gotKey != CallKey(k) {
			t.Fatalf("ParseResultSubject(ResultSubject(%q, %q)) = %q, %q, %v", team, k, gotTeam, gotKey, err)
		}
	})
}
