package protocol

import (
	"fmt"
	"unicode/utf8"
)

// Truncate cuts s to at most limit bytes on a UTF-8 boundary and appends a
// marker saying how much was kept, so the model knows the output is partial.
// The result, marker included, is at most limit bytes; when limit is too small
// for the marker, s is cut without one. s is returned as is when it fits.
func Truncate(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	// The marker is longest when it names len(s) twice; reserve that much.
	room := limit - len(truncationMarker(len(s), len(s)))
	if room < 0 {
		return s[:runeFloor(s, max(limit, 0))]
	}
	keep := runeFloor(s, room)
	return s[:keep] + truncationMarker(keep, len(s))
}

func truncationMarker(kept, total int) string {
	return fmt.Sprintf("\n[toolrelay: output truncated: first %d of %d bytes shown]", kept, total)
}

// runeFloor returns the largest n <= i at which s can be cut between runes.
func runeFloor(s string, i int) int {
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}
