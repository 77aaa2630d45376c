package protocol

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestCanonicalFunctionName(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"get_horoscope", "get_horoscope"},
		{"Get_Horoscope", "get_horoscope"},
		{"GET_HOROSCOPE", "get_horoscope"},
		{"get-horoscope", "get_horoscope"},
		{"get_horoscope_", "get_horoscope"},
		{"_get_horoscope", "get_horoscope"},
		{"get__horoscope", "get_horoscope"},
		{"get-_-horoscope", "get_horoscope"},
		{"getHoroscope", "gethoroscope"},
		{"get_horoscope2", "get_horoscope2"},
		{"___", "___"},
		{"-", "-"},
	} {
		if got := CanonicalFunctionName(tc.name); got != tc.want {
			t.Errorf("CanonicalFunctionName(%q) = %q, want %q", tc.name, got, tc.want)
		}
		if ValidateFunctionName(tc.name) != nil {
			t.Errorf("%q is not a valid name", tc.name)
		}
	}
}

// A schema is stored and handed on as declared, so bytes that are not
// UTF-8 (which decoding would quietly read as U+FFFD) are refused.
func TestToolTextRefusesInvalidUTF8(t *testing.T) {
	err := ValidateToolText("f", "", []byte("{\"type\":\"object\",\"properties\":{\"x\xff\":{}}}"))
	if !errors.Is(err, ErrToolText) || !strings.Contains(err.Error(), "not valid UTF-8 (at byte 33)") {
		t.Fatalf("ValidateToolText: %v, want a refusal naming byte 33", err)
	}
}

func TestDeclarationValidateSize(t *testing.T) {
	d := Declaration{Version: Version, Instance: "i", Executor: "e", StartedAt: time.Now(),
		Spec: FunctionSpec{Version: Version, Name: "f", Team: "t", Parameters: []byte(`{}`)}}
	if err := d.ValidateSize(MaxDeclarationSize); err != nil {
		t.Fatalf("at the bound: %v", err)
	}
	if err := d.ValidateSize(MaxDeclarationSize + 1); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "MaxDeclarationSize") {
		t.Errorf("over the bound: %v, want ErrTooLarge naming MaxDeclarationSize", err)
	}
	d.Executor = strings.Repeat("e", MaxLabelSize+1)
	if err := d.ValidateSize(1); !errors.Is(err, ErrTooLarge) || !strings.Contains(err.Error(), "executor") {
		t.Errorf("long executor: %v, want ErrTooLarge naming the executor", err)
	}
	d.Executor, d.Spec.FunctionVersion = "e", "v1\x1b[2J"
	if err := d.ValidateSize(1); !errors.Is(err, ErrMalformed) {
		t.Errorf("version with an escape: %v, want ErrMalformed", err)
	}
}
