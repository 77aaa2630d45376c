package otelconv

import (
	"fmt"
	"testing"
)

// A name is what build makes, whether it was cached or, past the bound,
// built again.
func TestNamesAreWhatBuildMakes(t *testing.T) {
	builds := 0
	n := NewNames(func(a, b string) string { builds++; return "send " + a + "." + b })
	for range 3 {
		if got := n.Get("geo", "get_weather"); got != "send geo.get_weather" {
			t.Fatalf("Get = %q", got)
		}
	}
	if builds != 1 {
		t.Fatalf("built %d times, want once", builds)
	}
	for i := range maxNames + 10 {
		fn := fmt.Sprint("f", i)
		if got := n.Get("geo", fn); got != "send geo."+fn {
			t.Fatalf("Get(%q) = %q", fn, got)
		}
	}
	if len(n.m) != maxNames {
		t.Fatalf("cache holds %d names, want the bound %d", len(n.m), maxNames)
	}
}
