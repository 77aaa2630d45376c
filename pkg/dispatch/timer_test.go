package dispatch

import (
	"testing"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestTimerSubjects(t *testing.T) {
	turn := protocol.NewTurnKey(protocol.PlatformAgents, "s", []string{"c"})
	for _, subj := range []string{timerScheduleSubject(turn), timerFireSubject(turn)} {
		if got, err := parseTimerSubject(subj); err != nil || got != turn {
			t.Errorf("parseTimerSubject(%s) = %s, %v; want %s", subj, got, err, turn)
		}
	}
	if got, err := parseTimerFireSubject(timerFireSubject(turn)); err != nil || got != turn {
		t.Errorf("parseTimerFireSubject round trip: %s %v", got, err)
	}
	if _, err := parseTimerFireSubject(timerScheduleSubject(turn)); err == nil {
		t.Error("parseTimerFireSubject accepted a schedule subject")
	}
	for _, bad := range []string{"fntimer.sched", "fntimer.other." + string(turn), "fncall.sched." + string(turn), "fntimer.fire.nothex", "fntimer.sched." + string(turn) + ".x", "fntimer.sched.", "fntimer." + string(turn)} {
		if _, err := parseTimerSubject(bad); err == nil {
			t.Errorf("parseTimerSubject(%q) accepted it", bad)
		}
	}
}
