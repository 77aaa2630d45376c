package lifecycle

import (
	"testing"
	"time"
)

// A turn a process tracks is re-checked when its age passes
// LeaseFor, 2×, 4×... that, then every RecheckEvery: a few times in a
// turn's life, however often the sweep runs, and never twice for one mark.
func TestRecheckDueOnAgesThatDouble(t *testing.T) {
	const every = 3 * time.Second // about how often the sweep runs
	var due []time.Duration
	for age := time.Duration(0); age < 10*time.Minute; age += every {
		if RecheckDue(age, every) {
			due = append(due, age)
		}
	}
	// One sweep just after each of 15 s, 30 s, 1 m, 2 m, then every 2 m.
	want := []time.Duration{15 * time.Second, 30 * time.Second, 60 * time.Second, 120 * time.Second, 240 * time.Second, 360 * time.Second, 480 * time.Second}
	if len(due) != len(want) {
		t.Fatalf("re-checked at %v, want once just after each of %v", due, want)
	}
	for i := range want {
		if due[i] < want[i] || due[i] >= want[i]+every {
			t.Errorf("re-check %d at age %s, want within one sweep after %s", i, due[i], want[i])
		}
	}
	// The first sweep after a restart of the loop (sinceLast unknown, so
	// large) re-checks every turn past LeaseFor once.
	if !RecheckDue(7*time.Minute, time.Hour) || RecheckDue(10*time.Second, time.Hour) {
		t.Error("a first sweep should re-check the turns older than LeaseFor, and only those")
	}
}
