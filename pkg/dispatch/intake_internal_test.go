package dispatch

import (
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Calls go out beside the record only for a turn whose creation time
// proves that any repeat of its intake falls inside the calls stream's
// dedupe window.
func TestOnlyYoungTurnsPublishEarly(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name    string
		created time.Time
		want    bool
	}{
		{"created now", now, true},
		{"a run nine minutes old", now.Add(-9 * time.Minute), true},
		{"older than the window allows", now.Add(-earlyWithin), false},
		{"a response from yesterday", now.Add(-24 * time.Hour), false},
		{"no creation time", time.Time{}, false},
		{"a platform clock a little ahead", now.Add(30 * time.Second), true},
		{"a platform clock far ahead", now.Add(time.Hour), false},
	} {
		if got := publishEarly(c.created, now); got != c.want {
			t.Errorf("%s: publishEarly = %v, want %v", c.name, got, c.want)
		}
	}
	if earlyWithin+clockSkew >= protocol.DuplicateWindow {
		t.Errorf("earlyWithin %s and clockSkew %s leave no margin in the %s dedupe window", earlyWithin, clockSkew, protocol.DuplicateWindow)
	}
}
