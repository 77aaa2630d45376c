package dispatch

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// fill sets every field reachable from v to a value that is not zero,
// drawing strings from s, so that an encoder that forgets a field (one
// added to Turn later, say) loses something the test sees.
func fill(v reflect.Value, s string, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(s + strconv.Itoa(*n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int64, reflect.Int32:
		v.SetInt(int64(*n))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), s, n)
	case reflect.Slice:
		if v.Type() == reflect.TypeFor[json.RawMessage]() {
			q, _ := json.Marshal(s)
			v.SetBytes([]byte(` {"q": ` + string(q) + ` , "n": [1, 2.5e3]} `))
			return
		}
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		for i := range 2 {
			fill(v.Index(i), s, n)
		}
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		for i := range 3 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(k, s+strconv.Itoa(i), n)
			fill(e, s, n)
			v.SetMapIndex(k, e)
		}
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 12, 1, 23, 0, *n, 123456789**n%1e9, time.UTC)))
			return
		}
		for i := range v.NumField() {
			fill(v.Field(i), s, n)
		}
	default:
		panic("fill: no case for " + v.Kind().String())
	}
}

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
	if !json.Valid(got) {
		t.Fatalf("appendTurn wrote invalid JSON: %s", got)
	}
	var fromStd, fromOurs any
	if err := json.Unmarshal(want, &fromStd); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &fromOurs); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fromStd, fromOurs) {
		t.Fatalf("records differ\nencoding/json: %s\nappendTurn:    %s", want, got)
	}
}

func TestRecordEncodingMatchesJSON(t *testing.T) {
	var full Turn
	n := 0
	fill(reflect.ValueOf(&full).Elem(), "x", &n)
	sameRecord(t, &full)

	// And every optional field left out.
	sameRecord(t, &Turn{Version: protocol.Version, Key: "k", State: TurnCollecting})
	sameRecord(t, &Turn{Calls: []TurnCall{{ID: "c"}}, Next: &Ref{}, Ref: Ref{Agent: &AgentReference{}}, TimedOut: []protocol.CallKey{}, Trace: map[string]string{}})

	// Strings that need escaping: quotes, controls, HTML, line separators
	// and bytes that are not UTF-8.
	for _, s := range []string{`"\`, "\x00\x01\n\r\t\x1f\x7f", "<a>&amp;", "\u2028\u2029", "é€𝄞", "\xff\xfe", "a\xc3", "\xed\xa0\x80"} {
		var turn Turn
		n := 0
		fill(reflect.ValueOf(&turn).Elem(), s, &n)
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
		n := 0
		fill(reflect.ValueOf(&turn).Elem(), s, &n)
		turn.Calls[0].ID = id
		if json.Valid([]byte(args)) {
			turn.Calls[1].Arguments = json.RawMessage(args)
		}
		sameRecord(t, &turn)
	})
}
