package suggest

import "testing"

func TestClosest(t *testing.T) {
	known := []string{"parameters", "required", "properties", "name"}
	for typo, want := range map[string]string{
		"paramters":  "parameters", // a letter left out
		"requird":    "required",
		"propreties": "properties", // two letters swapped
		"colour":     "",           // nothing near
		"nmae":       "name",
	} {
		if got := Closest(typo, known); got != want {
			t.Errorf("Closest(%q) = %q, want %q", typo, got, want)
		}
	}
}
