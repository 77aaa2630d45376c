package dispatch

import (
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestRetention(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	platform := &Turn{Ref: Ref{Platform: protocol.PlatformAssistants}, Scope: "thread_1/run_1", CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
	direct := &Turn{Ref: Ref{Platform: protocol.PlatformMCP}, Scope: "mcp/3f1c", CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	started := &Turn{Ref: Ref{Platform: protocol.PlatformMCP}, Scope: startedScope("client", "3f1c"), CreatedAt: now, ExpiresAt: now.Add(time.Minute)}
	agents := &Turn{Ref: Ref{Platform: protocol.PlatformAgents}, Scope: "sess_1/turn_1", CreatedAt: now, ExpiresAt: now.Add(10 * time.Minute)}
	longStarted := &Turn{Ref: Ref{Platform: protocol.PlatformMCP}, Scope: startedScope("client", "3f1d"), CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	tests := []struct {
		name              string
		t                 *Turn
		at                time.Time
		keep              time.Time
		closedTTL, result time.Duration
	}{
		{"platform turn closed at once", platform, now, now.Add(20 * time.Minute), 20 * time.Minute, 20 * time.Minute},
		{"platform turn closed after its expiry", platform, now.Add(25 * time.Minute), now.Add(20 * time.Minute), closedMinTTL, protocol.ResultMinTTL},
		{"direct call", direct, now.Add(time.Second), now.Add(11 * time.Minute), 11*time.Minute - time.Second, 11*time.Minute - time.Second},
		{"started call: an hour from its start", started, now.Add(time.Second), now.Add(StartedCallTTL), StartedCallTTL - time.Second, StartedCallTTL - time.Second},
		{"started call running an hour", longStarted, now.Add(time.Hour), now.Add(70 * time.Minute), 10 * time.Minute, 10 * time.Minute},
		{"Agents turn: as long as its step", agents, now.Add(time.Minute), now.Add(stepKeep), stepKeep - time.Minute, stepKeep - time.Minute},
		{"rounded up to a second", platform, now.Add(300 * time.Millisecond), now.Add(20 * time.Minute), 20 * time.Minute, 20 * time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.t.keepUntil(); !got.Equal(tc.keep) {
				t.Errorf("keepUntil = %s, want %s", got, tc.keep)
			}
			if got := tc.t.closedTTL(tc.at); got != tc.closedTTL {
				t.Errorf("closedTTL = %s, want %s", got, tc.closedTTL)
			}
			if got := tc.t.resultTTL(tc.at); got != tc.result {
				t.Errorf("resultTTL = %s, want %s", got, tc.result)
			}
		})
	}
}

// A closed turn the index still shows after its results expired reports
// them as expired, not pending; one within its keep still reads pending.
func TestExpiredResultsReadAsExpired(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "r")
	turn := func(expired time.Time) *Turn {
		key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_"+expired.Format("150405.000000000"), []string{"call_1"})
		return &Turn{Key: key, Ref: Ref{Platform: protocol.PlatformResponses}, State: TurnSubmitted, CreatedAt: expired.Add(-10 * time.Minute),
			ExpiresAt: expired, Calls: []TurnCall{{ID: "call_1", Name: "noop", Key: key.Call("call_1"), Team: protocol.SystemTeam}}}
	}
	for _, tc := range []struct {
		name    string
		expired time.Time
		want    string
	}{
		{"past its keep", time.Now().Add(-time.Hour), "expired"},
		{"within its keep", time.Now().Add(-time.Minute), "pending"},
	} {
		reports := d.callReports(t.Context(), turn(tc.expired))
		if len(reports) != 1 || reports[0].Result != tc.want {
			t.Errorf("%s: reports %+v, want one %s", tc.name, reports, tc.want)
		}
	}
}

// An Agents turn is kept as long as the step that names it.
func TestAnAgentsTurnOutlivesNoStepNamingIt(t *testing.T) {
	if got := provision.StepBucketConfig(provision.Options{}).TTL; got != stepKeep {
		t.Fatalf("the step bucket keeps a step %s, Agents turns are kept %s: a repeated step would find no turn", got, stepKeep)
	}
}
