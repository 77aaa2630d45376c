package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "update golden files in testdata/")

func TestValidateNames(t *testing.T) {
	tests := []struct {
		name     string
		function bool
		team     bool
	}{
		{"get_weather", true, true},
		{"getUserFavoriteCity", true, false},
		{"a-b_c9", true, true},
		{strings.Repeat("x", 64), true, false},
		{strings.Repeat("x", 65), false, false},
		{"", false, false},
		{"fn.evil", false, false},
		{"fn*", false, false},
		{"fn>", false, false},
		{"has space", false, false},
		{"tab\t", false, false},
		{"_toolrelay", true, false},
		{"Payments", true, false},
		{"ünïcode", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := ValidateFunctionName(tc.name); (err == nil) != tc.function {
				t.Errorf("ValidateFunctionName(%q) = %v, want ok=%v", tc.name, err, tc.function)
			} else if err != nil && !errors.Is(err, ErrInvalidName) {
				t.Errorf("error %v does not wrap ErrInvalidName", err)
			}
			if err := ValidateTeamName(tc.name); (err == nil) != tc.team {
				t.Errorf("ValidateTeamName(%q) = %v, want ok=%v", tc.name, err, tc.team)
			}
		})
	}
}

func TestTurnKeyIsDeterministicAndOrderFree(t *testing.T) {
	a := NewTurnKey(PlatformAgents, "as_1/turn_1", []string{"call_a", "call_b"})
	b := NewTurnKey(PlatformAgents, "as_1/turn_1", []string{"call_b", "call_a"})
	if a != b {
		t.Fatalf("order of call IDs changed the key: %s vs %s", a, b)
	}
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	others := []TurnKey{
		NewTurnKey(PlatformAssistants, "as_1/turn_1", []string{"call_a", "call_b"}),
		NewTurnKey(PlatformAgents, "as_1/turn_2", []string{"call_a", "call_b"}),
		NewTurnKey(PlatformAgents, "as_1/turn_1", []string{"call_a"}),
		NewTurnKey(PlatformAgents, "as_1/turn_1", []string{"call_ac", "all_b"}),
	}
	for _, o := range others {
		if o == a {
			t.Errorf("different turns share key %s", a)
		}
	}
}

func TestCallKey(t *testing.T) {
	turn := NewTurnKey(PlatformResponses, "resp_1", []string{"call_1", "call_2"})
	k1, k2 := turn.Call("call_1"), turn.Call("call_2")
	if k1 == k2 {
		t.Fatal("two calls share a key")
	}
	if k1 != turn.Call("call_1") {
		t.Fatal("call key is not deterministic")
	}
	for _, k := range []CallKey{k1, k2} {
		if err := k.Validate(); err != nil {
			t.Fatal(err)
		}
		if k.Turn() != turn {
			t.Errorf("%s.Turn() = %s, want %s", k, k.Turn(), turn)
		}
		parsed, err := ParseCallKey(string(k))
		if err != nil || parsed != k {
			t.Errorf("ParseCallKey(%s) = %s, %v", k, parsed, err)
		}
	}
	for _, bad := range []string{"", "abc", string(turn), string(turn) + ".", string(turn) + ".XYZ0123456789abc", string(k1) + "0", "*." + string(k1)} {
		if _, err := ParseCallKey(bad); err == nil {
			t.Errorf("ParseCallKey(%q) accepted a malformed key", bad)
		}
	}
}

func TestSubjects(t *testing.T) {
	if got := CallSubject("payments", "issue_refund"); got != "fncall.payments.issue_refund" {
		t.Errorf("CallSubject = %s", got)
	}
	team, fn, err := ParseCallSubject("fncall.payments.issue_refund")
	if err != nil || team != "payments" || fn != "issue_refund" {
		t.Errorf("ParseCallSubject = %s %s %v", team, fn, err)
	}
	for _, bad := range []string{"fncall.payments", "fncall.payments.a.b", "fnresult.payments.x", "fncall.Pay.x", "fncall.pay.x y", "fncall.pay.*"} {
		if _, _, err := ParseCallSubject(bad); err == nil {
			t.Errorf("ParseCallSubject(%q) accepted it", bad)
		}
	}

	key := NewTurnKey(PlatformAgents, "s", []string{"c"}).Call("c")
	subj := ResultSubject("payments", key)
	team, got, err := ParseResultSubject(subj)
	if err != nil || team != "payments" || got != key {
		t.Errorf("ParseResultSubject(%s) = %s %s %v", subj, team, got, err)
	}
	if _, _, err := ParseResultSubject(ResultSubject(SystemTeam, key)); err != nil {
		t.Errorf("system team result subject rejected: %v", err)
	}
	if !strings.HasPrefix(subj, "fnresult.payments."+string(key.Turn())+".") {
		t.Errorf("result subject %s does not match the turn filter layout", subj)
	}
	if f := TurnResultsFilter(key.Turn()); f != "fnresult.*."+string(key.Turn())+".*" {
		t.Errorf("TurnResultsFilter = %s", f)
	}
}

func sampleCall() *Call {
	turn := NewTurnKey(PlatformAssistants, "thread_1/run_1", []string{"call_1"})
	return &Call{
		Version:   Version,
		Key:       turn.Call("call_1"),
		Platform:  PlatformAssistants,
		Scope:     "thread_1/run_1",
		CallID:    "call_1",
		Team:      "geo",
		Function:  "getCurrentWeatherAtLocation",
		Arguments: json.RawMessage(`{"location":"Seattle, WA","unit":"f"}`),
		Deadline:  time.Date(2026, 1, 1, 0, 9, 30, 0, time.UTC),
		CreatedAt: time.Date(2026, 1, 1, 0, 0, 1, 500, time.UTC),
		// KeepResultUntil: the run's expiry (deadline + 30 s) + 10 minutes.
		KeepResultUntil: time.Date(2026, 1, 1, 0, 20, 0, 0, time.UTC),
	}
}

func sampleResults() map[string]*Result {
	c := sampleCall()
	ok := &Result{
		Version: Version, Key: c.Key, CallID: c.CallID, Team: c.Team, Function: c.Function,
		Output: "70f", Executor: "exec-1", Attempt: 1,
		StartedAt:  time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC),
		FinishedAt: time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC),
	}
	failed := NewFailure(c, CodeTimeout, "getCurrentWeatherAtLocation timed out after 9m30s", time.Date(2026, 1, 1, 0, 9, 30, 0, time.UTC))
	return map[string]*Result{"result_ok": ok, "result_failed": failed}
}

// sampleEnvelopes are the golden envelopes: what is on the wire, checked
// byte for byte, and embedded in docs/protocol.md (see doc_test.go).
func sampleEnvelopes() map[string]any {
	c := sampleCall()
	envs := map[string]any{"call": c}
	for name, r := range sampleResults() {
		envs[name] = r
	}
	spec := &FunctionSpec{
		Version: Version, Name: c.Function, Team: c.Team,
		Description: "The current weather at a location.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"location":{"type":"string"},"unit":{"enum":["c","f"]}},"required":["location"]}`),
		Timeout:     Duration(30 * time.Second), MaxConcurrency: 50, FunctionVersion: "1.4.0",
		UpdatedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	envs["function_spec"] = spec
	envs["declaration"] = &Declaration{
		Version: Version, Spec: *spec, Instance: "3f2c9a4e-6b1d-4f7a-9c85-0d2e1b7a6c34", Executor: "geo-7d9f-1",
		StartedAt: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC),
	}
	failed := NewFailure(c, CodeFunctionError, "The weather service refused the location.", time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC))
	failed.Executor, failed.Attempt = "geo-7d9f-1", 1
	envs["dead_letter"] = &DeadLetter{
		Version: Version, Call: c, Result: failed, Reason: ReasonPermanent, Attempts: 1, Executor: "geo-7d9f-1",
		At: time.Date(2026, 1, 1, 0, 0, 3, 0, time.UTC),
	}
	envs["attempt_mark"] = &AttemptMark{State: AttemptRunning, Attempt: 1, Executor: "geo-7d9f-1", At: time.Date(2026, 1, 1, 0, 0, 2, 0, time.UTC)}
	return envs
}

func encodeEnvelope(v any) ([]byte, error) {
	switch v := v.(type) {
	case *Call:
		return EncodeCall(v)
	case *Result:
		return EncodeResult(v)
	case *FunctionSpec:
		return EncodeFunctionSpec(v)
	case *Declaration:
		return EncodeDeclaration(v)
	case *DeadLetter:
		return EncodeDeadLetter(v)
	case *AttemptMark:
		return EncodeAttemptMark(v)
	}
	return nil, fmt.Errorf("no encoder for %T", v)
}

func TestGoldenEnvelopes(t *testing.T) {
	for name, v := range sampleEnvelopes() {
		t.Run(name, func(t *testing.T) {
			got, err := encodeEnvelope(v)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", name+".golden.json")
			if *update {
				if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -update to create it)", err)
			}
			if diff := cmp.Diff(strings.TrimSpace(string(want)), string(got)); diff != "" {
				t.Errorf("envelope changed (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCallRoundTrip(t *testing.T) {
	c := sampleCall()
	b, err := EncodeCall(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeCall(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
}

func TestCallResultTTL(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		keep time.Time
		want time.Duration
	}{
		{"none: the stream's MaxAge", time.Time{}, 0},
		{"until keep, rounded up to a second", now.Add(20*time.Minute + 300*time.Millisecond), 20*time.Minute + time.Second},
		{"keep passed: the least", now.Add(-time.Hour), ResultMinTTL},
		{"keep soon: the least", now.Add(time.Second), ResultMinTTL},
		{"keep far off: the most", now.Add(30 * 24 * time.Hour), ResultMaxAge},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := sampleCall()
			c.KeepResultUntil = tc.keep
			if got := c.ResultTTL(now); got != tc.want {
				t.Errorf("ResultTTL = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestCallWithoutKeepResultUntil(t *testing.T) {
	// An envelope of a dispatcher older than the field decodes, and
	// encodes back without it.
	c := sampleCall()
	c.KeepResultUntil = time.Time{}
	b, err := EncodeCall(c)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(b, []byte("keep_result_until")) {
		t.Errorf("encoded %s: want no keep_result_until", b)
	}
	got, err := DecodeCall(b)
	if err != nil {
		t.Fatal(err)
	}
	if !got.KeepResultUntil.IsZero() || got.ResultTTL(time.Now()) != 0 {
		t.Errorf("decoded keep_result_until %v, TTL %s: want none", got.KeepResultUntil, got.ResultTTL(time.Now()))
	}
}

func TestResultRoundTrip(t *testing.T) {
	for name, r := range sampleResults() {
		b, err := EncodeResult(r)
		if err != nil {
			t.Fatal(name, err)
		}
		got, err := DecodeResult(b)
		if err != nil {
			t.Fatal(name, err)
		}
		if diff := cmp.Diff(r, got); diff != "" {
			t.Errorf("%s round trip (-want +got):\n%s", name, diff)
		}
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := EncodeCall(sampleCall())
	var m map[string]any
	_ = json.Unmarshal(good, &m)
	mutate := func(k string, v any) []byte {
		c := map[string]any{}
		for kk, vv := range m {
			c[kk] = vv
		}
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		b, _ := json.Marshal(c)
		return b
	}
	tests := map[string][]byte{
		"not json":          []byte("nope"),
		"trailing":          append(append([]byte{}, good...), []byte(`{}`)...),
		"future version":    mutate("v", 99),
		"no call id":        mutate("call_id", nil),
		"bad function":      mutate("function", "a.b"),
		"bad team":          mutate("team", "x>"),
		"bad platform":      mutate("platform", "slack"),
		"bad key":           mutate("key", "zz"),
		"no deadline":       mutate("deadline", nil),
		"arguments missing": mutate("arguments", nil),
	}
	for name, b := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := DecodeCall(b); !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrInvalidName) {
				t.Errorf("DecodeCall accepted or gave unclassified error: %v", err)
			}
		})
	}

	r := sampleResults()["result_ok"]
	both := *r
	both.Error = &CallError{Code: CodeFunctionError, Message: "x"}
	badCode := *r
	badCode.Output = ""
	badCode.Error = &CallError{Code: "weird", Message: "x"}
	badUTF8 := *r
	badUTF8.Output = "\xff"
	for name, rr := range map[string]*Result{"output and error": &both, "unknown code": &badCode, "invalid utf8": &badUTF8} {
		if _, err := EncodeResult(rr); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: EncodeResult = %v, want ErrMalformed", name, err)
		}
	}
}

func TestModelOutput(t *testing.T) {
	res := sampleResults()
	if got := res["result_ok"].ModelOutput(); got != "70f" {
		t.Errorf("ok ModelOutput = %q", got)
	}
	want := `{"error":{"type":"timeout","message":"getCurrentWeatherAtLocation timed out after 9m30s"}}`
	if got := res["result_failed"].ModelOutput(); got != want {
		t.Errorf("failed ModelOutput = %s, want %s", got, want)
	}
}

func TestTruncate(t *testing.T) {
	if got := Truncate("short", 10); got != "short" {
		t.Errorf("Truncate kept-as-is = %q", got)
	}
	long := strings.Repeat("é", 1000) // 2000 bytes
	got := Truncate(long, 500)
	if len(got) > 500 {
		t.Errorf("len = %d, want <= 500", len(got))
	}
	if !utf8.ValidString(got) {
		t.Error("cut inside a rune")
	}
	if !strings.Contains(got, "of 2000 bytes shown]") {
		t.Errorf("no marker in %q", got[len(got)-80:])
	}
	if got := Truncate(long, 5); len(got) > 5 || !utf8.ValidString(got) {
		t.Errorf("tiny limit: %q", got)
	}
}

func TestFunctionSpec(t *testing.T) {
	s := &FunctionSpec{
		Version: Version, Name: "get_weather", Team: "geo",
		Parameters: json.RawMessage(`{"type":"object"}`),
		Timeout:    Duration(30 * time.Second), UpdatedAt: time.Unix(1767225600, 0).UTC(),
	}
	b, err := EncodeFunctionSpec(s)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), `"timeout":"30s"`) {
		t.Errorf("timeout not a duration string: %s", b)
	}
	got, err := DecodeFunctionSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	bad := *s
	bad.Parameters = json.RawMessage(`[1]`)
	if _, err := EncodeFunctionSpec(&bad); err == nil {
		t.Error("non-object schema accepted")
	}
	bad.Parameters = nil
	if _, err := EncodeFunctionSpec(&bad); err == nil {
		t.Error("a function without parameters or format accepted")
	}

	// A custom tool has a format and no parameters.
	custom := *s
	custom.Parameters = nil
	custom.Format = &InputFormat{Type: FormatGrammar, Syntax: SyntaxRegex, Definition: "Aries|Taurus"}
	b, err = EncodeFunctionSpec(&custom)
	if err != nil {
		t.Fatalf("a custom tool's spec: %v", err)
	}
	got, err = DecodeFunctionSpec(b)
	if err != nil {
		t.Fatalf("a custom tool's spec %s: %v", b, err)
	}
	if diff := cmp.Diff(custom.Format, got.Format); diff != "" {
		t.Errorf("format (-want +got):\n%s", diff)
	}
	custom.Parameters = json.RawMessage(`{"type":"object"}`)
	if _, err := EncodeFunctionSpec(&custom); err == nil {
		t.Error("a custom tool with parameters accepted")
	}
}

func TestHeaderCarrierKeepsCase(t *testing.T) {
	h := map[string][]string{}
	c := HeaderCarrier(h)
	c.Set("traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	if _, ok := h["traceparent"]; !ok {
		t.Fatalf("key was rewritten: %v", h)
	}
	if c.Get("traceparent") == "" || c.Get("Traceparent") != "" {
		t.Error("lookup is not exact")
	}
	if len(c.Keys()) != 1 {
		t.Errorf("keys = %v", c.Keys())
	}
}

// Keys are stored (turn records, message IDs, result subjects), so a
// dispatcher of one version must derive the keys an older one did: these
// values were computed by the first release's derivation.
func TestKeysAreStableAcrossVersions(t *testing.T) {
	turn := NewTurnKey(PlatformAgents, "s:1", []string{"b", "a"})
	if want := TurnKey("87ec06af8005b70ef47e453f21a4d31b"); turn != want {
		t.Errorf("turn key %s, want %s", turn, want)
	}
	if got, want := turn.Call("call_1"), CallKey("87ec06af8005b70ef47e453f21a4d31b.e941a8b7066bfdd2"); got != want {
		t.Errorf("call key %s, want %s", got, want)
	}
	if got, want := NewTurnKey(PlatformResponses, "", nil), TurnKey("5884adda0eba558e927840c0e4a6bb5a"); got != want {
		t.Errorf("empty turn key %s, want %s", got, want)
	}
}

// A function's title, icons and output schema travel with its spec, and
// each is checked: icons are https or inline images within their bounds,
// an output schema describes an object, a title is bounded tool text.
func TestFunctionSpecDisplayMetadata(t *testing.T) {
	good := &FunctionSpec{
		Version: Version, Name: "get_weather", Team: "geo", Parameters: json.RawMessage(`{"type":"object"}`),
		Title: "Weather now", UpdatedAt: time.Unix(1767225600, 0).UTC(),
		Icons: []Icon{{Src: "https://icons.example.com/w.svg", MIMEType: "image/svg+xml", Sizes: []string{"any"}, Theme: "dark"},
			{Src: "data:image/png;base64,iVBORw0KGgo=", Sizes: []string{"48x48", "96x96"}}},
		OutputSchema: json.RawMessage(`{"type":"object","properties":{"t":{"type":"number","description":"degrees"}}}`),
	}
	b, err := EncodeFunctionSpec(good)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeFunctionSpec(b)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(good, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if err := good.ValidateToolText(); err != nil {
		t.Errorf("good tool text refused: %v", err)
	}

	for _, c := range []struct {
		name   string
		change func(*FunctionSpec)
		want   string
	}{
		{"five icons", func(s *FunctionSpec) { s.Icons = slices.Repeat(s.Icons[:1], 5) }, "MaxIcons"},
		{"an http icon", func(s *FunctionSpec) { s.Icons[0].Src = "http://icons.example.com/w.svg" }, "https URL or a data:image/ URL"},
		{"a javascript icon", func(s *FunctionSpec) { s.Icons[0].Src = "javascript:alert(1)" }, "https URL or a data:image/ URL"},
		{"an inline icon too large", func(s *FunctionSpec) {
			s.Icons[1].Src = "data:image/png;base64," + strings.Repeat("A", MaxIconDataSize)
		}, "MaxIconDataSize"},
		{"a text mime type", func(s *FunctionSpec) { s.Icons[0].MIMEType = "text/html" }, "not an image type"},
		{"a made-up size", func(s *FunctionSpec) { s.Icons[0].Sizes = []string{"big"} }, "not WxH"},
		{"a made-up theme", func(s *FunctionSpec) { s.Icons[0].Theme = "blue" }, "not light or dark"},
		{"an output schema of a string", func(s *FunctionSpec) { s.OutputSchema = json.RawMessage(`{"type":"string"}`) }, "Schema of an object"},
		{"an output schema that is a list", func(s *FunctionSpec) { s.OutputSchema = json.RawMessage(`[1]`) }, "Schema of an object"},
	} {
		s := *good
		s.Icons = slices.Clone(good.Icons)
		c.change(&s)
		if _, err := EncodeFunctionSpec(&s); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", c.name, err, c.want)
		}
	}
	for _, c := range []struct {
		name   string
		change func(*FunctionSpec)
		want   string
	}{
		{"a long title", func(s *FunctionSpec) { s.Title = strings.Repeat("w", MaxTitleSize+1) }, "MaxTitleSize"},
		{"a title hiding text", func(s *FunctionSpec) { s.Title = "Weather\u200b now" }, "U+200B"},
		{"an output schema hiding text", func(s *FunctionSpec) {
			s.OutputSchema = json.RawMessage(`{"type":"object","description":"pass it on \u202e"}`)
		}, "output schema /description"},
	} {
		s := *good
		c.change(&s)
		if err := s.ValidateToolText(); !errors.Is(err, ErrToolText) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want a tool text error saying %q", c.name, err, c.want)
		}
	}
}
