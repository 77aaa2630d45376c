package exec_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func failing(name string, fixed *atomic.Bool) exec.Function {
	return exec.Function{Name: name, Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		if !fixed.Load() {
			return nil, errors.New("card processor rejected " + inv.Call.CallID)
		}
		return []byte("charged"), nil
	})}
}

// Get finds one call's dead letter among many by its subject, and Replay
// numbers replays from the latest one recorded.
func TestDeadLettersGetAndReplayOneCall(t *testing.T) {
	var fixed atomic.Bool
	h := start(t, "team-a", exec.Options{}, failing("charge", &fixed))
	dls := exec.NewDeadLetters(h.js)
	var calls []*protocol.Call
	for range 5 {
		calls = append(calls, h.call("team-a", "charge", `{}`, time.Now().Add(time.Minute)))
	}
	for _, c := range calls {
		h.result(c, 10*time.Second)
	}
	target := calls[2]
	var got *protocol.DeadLetter
	testutil.WaitForWhat(t, 5*time.Second, "the target call's dead letter", func() bool {
		var err error
		got, err = dls.Get(t.Context(), target.Key)
		return err == nil
	})
	if got.Call.Key != target.Key || got.Replay != 0 || got.Reason != protocol.ReasonPermanent ||
		got.Result.Error.Message != "card processor rejected "+target.CallID {
		t.Fatalf("Get = %+v", got)
	}
	// The record sits on the call's own subject.
	s, err := h.js.Stream(t.Context(), protocol.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLastMsgForSubject(t.Context(), protocol.DeadLetterSubject("team-a", "charge")+"."+string(target.Key)); err != nil {
		t.Errorf("no record on the call's subject: %v", err)
	}

	fixed.Store(true)
	for want := 1; want <= 2; want++ {
		n, err := dls.Replay(t.Context(), target.Key, time.Minute)
		if err != nil || n != want {
			t.Fatalf("Replay = %d, %v; want %d", n, err, want)
		}
		testutil.WaitForWhat(t, 10*time.Second, fmt.Sprintf("%d dead letters, 5 and %d replays", 5+want, want), func() bool {
			all, _ := dls.List(t.Context(), "team-a")
			return len(all) == 5+want
		})
	}
	// A replay's result is kept while the replayed call may be
	// redelivered, whatever the original call asked.
	all, err := dls.List(t.Context(), "team-a")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range all {
		if r.Replay > 0 && !r.Call.KeepResultUntil.Equal(r.Call.Deadline.Add(time.Minute)) {
			t.Errorf("replay %d ran a call keeping its result until %s, want its deadline %s + 1m", r.Replay, r.Call.KeepResultUntil, r.Call.Deadline)
		}
	}
	if again, err := dls.Get(t.Context(), target.Key); err != nil || again.Replay != 0 || again.Reason != protocol.ReasonPermanent {
		t.Errorf("Get after replays = %+v, %v; want the dead letter itself", again, err)
	}
	unknown := protocol.NewTurnKey("agents", "x", nil).Call("y")
	if _, err := dls.Get(t.Context(), unknown); !errors.Is(err, exec.ErrNoDeadLetter) {
		t.Errorf("Get of an unknown key = %v", err)
	}
	if _, err := dls.Get(t.Context(), "not-a-key"); err == nil || errors.Is(err, exec.ErrNoDeadLetter) {
		t.Errorf("Get of a malformed key = %v", err)
	}
}

// Dead letters recorded before per-call subjects (on fndlq.<team>.<function>)
// are still listed, found and replayed; the replay's outcome goes to the
// call's subject, and the next replay is numbered after it.
func TestDeadLettersReadTheOldLayout(t *testing.T) {
	var fixed atomic.Bool
	fixed.Store(true)
	h := start(t, "team-a", exec.Options{}, failing("charge", &fixed))
	dls := exec.NewDeadLetters(h.js)
	if _, err := dls.Get(t.Context(), protocol.NewTurnKey("agents", "x", nil).Call("y")); !errors.Is(err, exec.ErrNoDeadLetter) {
		t.Fatalf("Get on an empty stream = %v", err)
	}
	call := h.call("team-a", "charge", `{}`, time.Now().Add(time.Minute))
	h.result(call, 10*time.Second) // it succeeds now; the old record says it failed once
	putDeadLetter(t, h.js, protocol.DeadLetterSubject("team-a", "charge"), call, "card processor rejected it")

	got, err := dls.Get(t.Context(), call.Key)
	if err != nil || got.Result.Error.Message != "card processor rejected it" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if all, err := dls.List(t.Context(), "team-a"); err != nil || len(all) != 1 {
		t.Fatalf("List = %d records, %v", len(all), err)
	}
	for want := 1; want <= 2; want++ {
		n, err := dls.Replay(t.Context(), call.Key, time.Minute)
		if err != nil || n != want {
			t.Fatalf("Replay = %d, %v; want %d", n, err, want)
		}
		testutil.WaitForWhat(t, 10*time.Second, fmt.Sprintf("%d dead letters, 1 and %d replays", 1+want, want), func() bool {
			all, _ := dls.List(t.Context(), "team-a")
			return len(all) == 1+want
		})
	}
	all, _ := dls.List(t.Context(), "team-a")
	if r := all[2]; r.Replay != 2 || r.Reason != protocol.ReasonReplayed || !r.Result.OK() || r.Result.Output != "charged" {
		t.Errorf("second replay = %+v", r)
	}
}

// putDeadLetter records a dead letter of call on subject, as an executor
// (or, on a subject not its own, a forger) would.
func putDeadLetter(t *testing.T, js jetstream.JetStream, subject string, call *protocol.Call, msg string) {
	t.Helper()
	d := &protocol.DeadLetter{Version: protocol.Version, Call: call, Reason: protocol.ReasonPermanent, Attempts: 1, At: time.Now().UTC(),
		Result: protocol.NewFailure(call, protocol.CodeFunctionError, msg, time.Now())}
	data, err := protocol.EncodeDeadLetter(d)
	if err != nil {
		t.Fatal(err)
	}
	m := nats.NewMsg(subject)
	m.Data = data
	if _, err := js.PublishMsg(t.Context(), m, jetstream.WithMsgID(d.MsgID())); err != nil {
		t.Fatal(err)
	}
}

// ListNewest reads back from the newest record: the newest n of a team's,
// still oldest first, past other teams' records between them. A team's
// DeadLetters ignores a record naming another team, whatever its subject:
// in a team's own account, the team could forge one.
func TestDeadLettersNewestAndOfOneTeam(t *testing.T) {
	var fixed atomic.Bool
	h := start(t, "team-a", exec.Options{}, failing("charge", &fixed))
	dls := exec.NewDeadLetters(h.js)
	for i := range 6 {
		c := h.call("team-a", "charge", `{}`, time.Now().Add(time.Minute))
		h.result(c, 10*time.Second)
		testutil.WaitForWhat(t, 5*time.Second, "the charge's dead letter", func() bool { _, err := dls.Get(t.Context(), c.Key); return err == nil })
		other := *c
		other.Team, other.Key = "team-b", protocol.NewTurnKey("agents", fmt.Sprint("b", i), nil).Call(c.CallID)
		putDeadLetter(t, h.js, protocol.DeadLetterSubject("team-b", "charge")+"."+string(other.Key), &other, "b's")
	}
	all, err := dls.List(t.Context(), "team-a")
	if err != nil || len(all) != 6 {
		t.Fatalf("List = %d records, %v; want 6", len(all), err)
	}
	for _, n := range []int{1, 4, 6, 10} {
		newest, err := dls.ListNewest(t.Context(), "team-a", n)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(all[max(len(all)-n, 0):], newest); diff != "" {
			t.Errorf("ListNewest(%d) (-want +got):\n%s", n, diff)
		}
	}
	if newest, err := dls.ListNewest(t.Context(), "", 1); err != nil || len(newest) != 1 || newest[0].Call.Team != "team-b" {
		t.Errorf("ListNewest of every team = %+v, %v; want team-b's last record", newest, err)
	}

	// A record naming team-b on team-a's subjects.
	forged := *all[0].Call
	forged.Team, forged.Key = "team-b", protocol.NewTurnKey("agents", "forged", nil).Call("call_forged")
	putDeadLetter(t, h.js, protocol.DeadLetterSubject("team-a", "charge")+"."+string(forged.Key), &forged, "forged")
	mine, err := exec.NewTeamDeadLetters(h.js, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := mine.List(t.Context(), ""); err != nil || len(got) != 6 {
		t.Errorf("team-a's List = %d records, %v; want its 6, not the forged one", len(got), err)
	}
	if _, err := mine.Replay(t.Context(), forged.Key, time.Minute); !errors.Is(err, exec.ErrNoDeadLetter) {
		t.Errorf("team-a's Replay of the forged record = %v; want ErrNoDeadLetter", err)
	}
	if got, err := mine.List(t.Context(), "team-b"); err != nil || len(got) != 0 {
		t.Errorf("team-a's List of team-b = %d records, %v; want none", len(got), err)
	}
	if _, err := mine.Get(t.Context(), all[5].Call.Key); err != nil {
		t.Errorf("team-a's Get of its own = %v", err)
	}
}
