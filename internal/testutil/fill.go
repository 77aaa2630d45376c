package testutil

import (
	"encoding/json"
	"reflect"
	"strconv"
	"testing"
	"time"
)

// Fill sets every field reachable from ptr (a pointer to a struct) to a
// value that is not zero, its strings made from s: a test that encodes
// the value by hand and by encoding/json then sees any field the hand
// encoder forgets, including one added to the type later. Raw JSON gets
// an object with spacing, which encoding/json compacts.
func Fill(ptr any, s string) {
	n := 0
	fill(reflect.ValueOf(ptr).Elem(), s, &n)
}

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
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), s, n)
			}
		}
	default:
		panic("testutil.Fill: no case for " + v.Kind().String())
	}
}

// SameJSON fails t unless got is valid JSON that decodes to what want
// decodes to.
func SameJSON(t testing.TB, want, got []byte) {
	t.Helper()
	if !json.Valid(got) {
		t.Fatalf("invalid JSON: %s", got)
	}
	var w, g any
	if err := json.Unmarshal(want, &w); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(got, &g); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(w, g) {
		t.Fatalf("JSON differs\nencoding/json: %s\nby hand:       %s", want, got)
	}
}
