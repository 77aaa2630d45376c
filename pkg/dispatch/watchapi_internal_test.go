package dispatch

import (
	"reflect"
	"strings"
	"testing"
)

// The fields a watch request may have are the request struct's.
func TestWatchRequestFieldsMatchTheStruct(t *testing.T) {
	typ := reflect.TypeFor[watchRequest]()
	if typ.NumField() != len(watchRequestFields) {
		t.Fatalf("watchRequest has %d fields, watchRequestFields %d", typ.NumField(), len(watchRequestFields))
	}
	for i := range typ.NumField() {
		name, _, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		if !watchRequestFields[name] {
			t.Errorf("field %s (json %q) is missing from watchRequestFields", typ.Field(i).Name, name)
		}
	}
}

func TestDecodeWatchRequestNamesTheField(t *testing.T) {
	for body, want := range map[string]FieldError{
		``:                                      {Message: "the body is empty; send a JSON object"},
		`[1]`:                                   {Message: "the body must be one JSON object"},
		`{"platform":"agents","sesion_id":"x"}`: {Field: "sesion_id", Message: `unknown field "sesion_id"`},
		`{"platform":"agents","session_id":5}`:  {Field: "session_id", Message: "session_id must be a string"},
	} {
		_, fe := decodeWatchRequest([]byte(body))
		if fe == nil || fe.Field != want.Field || fe.Message != want.Message {
			t.Errorf("%q: %+v, want %+v", body, fe, want)
		}
	}
	if _, fe := decodeWatchRequest([]byte(`{"platform":"responses","response_id":"resp_1"}`)); fe != nil {
		t.Errorf("a good body: %+v", fe)
	}
}
