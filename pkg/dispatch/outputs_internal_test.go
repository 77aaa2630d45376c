package dispatch

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// resultStream creates team's result stream, as its executors would.
func resultStream(t *testing.T, js jetstream.JetStream, team string) {
	t.Helper()
	if _, err := js.CreateStream(t.Context(), provision.ResultStreamConfig(team, 0, provision.Options{})); err != nil {
		t.Fatal(err)
	}
}

// publishResult records output as the result of c, as an executor would.
func publishResult(t *testing.T, js jetstream.JetStream, c TurnCall, output string) {
	t.Helper()
	res := &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: c.Name,
		Output: output, FinishedAt: time.Now().UTC()}
	b, err := protocol.EncodeResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(t.Context(), res.Subject(), b); err != nil {
		t.Fatal(err)
	}
}

// A result known to be recorded can read as "not found" for a moment
// (before results were read from the stream's leader, a replica that
// lagged answered so, and a chaos soak lost a run). Submitting such a turn
// reads the result again instead of failing the whole turn; a cut-off
// turn asks the leader which results exist, so a read that misses does
// not make a recorded result a timeout either.
func TestARecordedResultThatReadsAsMissingForAMomentIsSubmitted(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "one")
	const team = "geo"
	resultStream(t, js, team)
	key := protocol.TurnKey("0123456789abcdef0123456789abcdef")
	c := TurnCall{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: team}
	turn := &Turn{Key: key, Calls: []TurnCall{c}, ExpiresAt: time.Now().Add(time.Minute)}
	publishResult(t, js, c, "sunny")

	var misses atomic.Int32
	d.gather.lastFor = func(ctx context.Context, s jetstream.Stream, subject string) (*jetstream.RawStreamMsg, error) {
		if misses.Add(1) <= 3 { // a lagging replica answers first
			return nil, jetstream.ErrMsgNotFound
		}
		return d.gather.leaderLastFor(ctx, s, subject)
	}
	if missing, err := (turnEnv{d}).Missing(t.Context(), rec(turn, 0)); err != nil || len(missing) != 0 {
		t.Fatalf("cut off, the turn counts %v as without a result; the stream holds it", missing)
	}
	out, err := d.outputs(t.Context(), turn)
	if err != nil {
		t.Fatalf("outputs: %v; want the result once the replica caught up", err)
	}
	if len(out) != 1 || out[0].Result.Output != "sunny" {
		t.Fatalf("outputs = %+v", out)
	}

	// A result that stays missing fails its call once the lag allowance
	// is spent, not the whole turn, and not after a wait until expiry.
	misses.Store(-1 << 30)
	started := time.Now()
	out, err = d.outputs(t.Context(), turn)
	if err != nil {
		t.Fatalf("outputs of a result that never appears: %v; want that call failed, not the turn", err)
	}
	if len(out) != 1 || out[0].Result.Error == nil || out[0].Result.Error.Code != protocol.CodeUnavailable {
		t.Fatalf("outputs = %+v; want the call failed as unavailable", out)
	}
	if waited := time.Since(started); waited > resultLagFor+5*time.Second {
		t.Fatalf("gave up after %s; want about %s", waited, resultLagFor)
	}
}

// What holds a call's result subject but is not its result (the first
// message on a subject wins, so nothing will follow it) fails that call
// only: the turn's other results still go out.
func TestAMalformedResultFailsOnlyItsCall(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "one")
	const team = "geo"
	resultStream(t, js, team)
	key := protocol.TurnKey("99990000aaaabbbbccccddddeeeeffff")
	good := TurnCall{ID: "call_good", Name: "get_weather", Key: key.Call("call_good"), Team: team}
	bad := TurnCall{ID: "call_bad", Name: "get_weather", Key: key.Call("call_bad"), Team: team}
	turn := &Turn{Key: key, Calls: []TurnCall{good, bad}, ExpiresAt: time.Now().Add(time.Minute)}
	publishResult(t, js, good, "sunny")
	if _, err := js.Publish(t.Context(), protocol.ResultSubject(team, bad.Key), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if missing, err := (turnEnv{d}).Missing(t.Context(), rec(turn, 0)); err != nil || len(missing) != 0 {
		t.Fatalf("cut off, the turn counts %v as without a result; both subjects hold a message", missing)
	}
	out, err := d.outputs(t.Context(), turn)
	if err != nil {
		t.Fatalf("outputs: %v; want only the malformed call failed", err)
	}
	if len(out) != 2 || out[0].Result.Output != "sunny" || out[1].Result.Error == nil || out[1].Result.Error.Code != protocol.CodeUnavailable {
		t.Fatalf("outputs = %+v %+v; want the good result and the bad call failed", out[0].Result, out[1].Result)
	}
}

// Every replica receives every result. One of a turn that no replica
// gathers for and whose lease is free (its owner stopped, or died and the
// lease lapsed) is taken up by the replica it reaches, which submits the
// turn a moment later. One of a turn another replica owns is left to that
// owner, which has it too: not gathered for here, nothing passed on.
func TestAResultOfATurnNobodyGathersForIsTakenUp(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "one")
	now := time.Now().UTC()
	turn := func(n int, lease lifecycle.Lease) (*Turn, TurnCall) {
		key := protocol.TurnKey(fmt.Sprintf("%032x", n))
		c := TurnCall{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: protocol.SystemTeam}
		tr := &Turn{Version: 1, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: fmt.Sprint("resp_", n)},
			State: TurnCollecting, Calls: []TurnCall{c}, CreatedAt: now, ExpiresAt: now.Add(time.Minute), Deadline: now.Add(50 * time.Second), lease: lease}
		if _, err := d.turns.create(t.Context(), tr); err != nil {
			t.Fatal(err)
		}
		return tr, c
	}
	owned, ownedCall := turn(1, lifecycle.Lease{Owner: "two/live", Until: now.Add(lifecycle.LeaseFor), Epoch: 1})
	// Handled by the same worker, after the other: once free is submitted,
	// owned's result was looked at.
	n := 2
	subject := func(n int) string {
		return protocol.ResultSubject(protocol.SystemTeam, protocol.TurnKey(fmt.Sprintf("%032x", n)).Call("call_1"))
	}
	for shard(subject(1)) != shard(subject(n)) {
		n++
	}
	free, freeCall := turn(n, lifecycle.Lease{Epoch: 1})
	publishResult(t, js, ownedCall, "sunny")
	publishResult(t, js, freeCall, "rainy")
	testutil.WaitForWhat(t, 10*time.Second, "the turn nobody gathered for to be submitted", func() bool {
		have, _, err := d.turns.get(t.Context(), free.Key)
		return err == nil && have.State == TurnSubmitted
	})
	if have, _, err := d.turns.get(t.Context(), owned.Key); err != nil || have.State != TurnCollecting || have.lease.Owner != "two/live" {
		t.Fatalf("the turn another replica owns: %+v %v; want it left collecting under its lease", have, err)
	}
	if d.gather.tracking(owned.Key) {
		t.Fatal("the replica gathers for a turn another owns after one of its results; want it left to the owner")
	}
}

// Every record the dispatcher decides on (turns, watches, steps, webhook
// and response marks, the registry) and every result it submits is read
// from its stream's leader: buckets and result streams allow direct gets,
// which any replica answers, and one that lags answers with an older
// revision or "not found" (a repeated intake then errs, an Agents step
// reads as new and its calls run again, a timer is dropped). A spy on the
// direct-get subjects sees none of the reads.
func TestTheDispatcherReadsFromTheLeader(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	spy, _ := srv.Connect(t)
	var direct atomic.Int64
	if _, err := spy.Subscribe("$JS.API.DIRECT.GET.>", func(m *nats.Msg) { direct.Add(1); t.Logf("direct get: %s", m.Subject) }); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	d := replica(t, js, "one")
	const team = "geo"
	resultStream(t, js, team)
	key := protocol.TurnKey("1234123412341234abcdabcdabcdabcd")
	c := TurnCall{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: team}
	turn := &Turn{Key: key, State: TurnCollecting, Calls: []TurnCall{c}, CreatedAt: time.Now().UTC(),
		Deadline: time.Now().Add(time.Minute).UTC(), ExpiresAt: time.Now().Add(2 * time.Minute).UTC()}
	ctx := t.Context()
	rev, err := d.turns.create(ctx, turn)
	if err != nil {
		t.Fatal(err)
	}
	if got, gotRev, err := d.turns.get(ctx, key); err != nil || gotRev != rev || got.Key != key {
		t.Fatalf("turns.get = %+v, %d, %v; want the record at %d", got, gotRev, err, rev)
	}
	for name, kv := range map[string]jetstream.KeyValue{"watches": d.watches, "steps": d.steps, "webhooks": d.webhooksSeen,
		"claims": d.registry.claims, "declarations": d.registry.decls} {
		if _, err := kv.Get(ctx, "absent"); err != jetstream.ErrKeyNotFound {
			t.Errorf("%s: Get of an absent key = %v, want jetstream.ErrKeyNotFound", name, err)
		}
	}
	// A result of a turn never recorded here: the gatherer cannot take it
	// in, so submitting reads it from the stream.
	other := protocol.TurnKey("5678567856785678efefefefefefefef")
	oc := TurnCall{ID: "call_1", Name: "get_weather", Key: other.Call("call_1"), Team: team}
	publishResult(t, js, oc, "sunny")
	out, err := d.outputs(ctx, &Turn{Key: other, Calls: []TurnCall{oc}, ExpiresAt: time.Now().Add(time.Minute)})
	if err != nil || len(out) != 1 || out[0].Result.Output != "sunny" {
		t.Fatalf("outputs = %+v, %v", out, err)
	}
	if err := spy.Flush(); err != nil { // every direct get sent so far has reached the spy
		t.Fatal(err)
	}
	if n := direct.Load(); n != 0 {
		t.Fatalf("%d reads were direct gets, which a lagging replica may answer", n)
	}
}

// A team's result stream deleted and created again (an operator, a
// store restored) starts its sequence again. The replica's consumer of it
// must not go on from the sequence it had reached in the old one: the
// first results of the new stream would pass it by, and a turn it took in
// would wait for its re-check.
func TestAResultStreamCreatedAgainIsConsumedFromItsStart(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "one")
	if _, err := d.gather.streams.stream(ctx, "geo"); err != nil {
		t.Fatal(err)
	}
	for i := range 5 { // the old stream's sequence moves on
		key := protocol.TurnKey(fmt.Sprintf("%032x", 100+i))
		publishResult(t, js, TurnCall{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: "geo"}, "old")
	}
	if err := js.DeleteStream(ctx, protocol.ResultStream("geo")); err != nil {
		t.Fatal(err)
	}
	resultStream(t, js, "geo")
	if _, err := d.gather.streams.stream(ctx, "geo"); err != nil { // as the next call routed to the team
		t.Fatal(err)
	}
	now := time.Now().UTC()
	key := protocol.TurnKey(fmt.Sprintf("%032x", 1))
	c := TurnCall{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: "geo"}
	turn := &Turn{Version: 1, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_again"},
		State: TurnCollecting, Calls: []TurnCall{c}, CreatedAt: now, ExpiresAt: now.Add(time.Minute), Deadline: now.Add(50 * time.Second),
		lease: d.engine.IntakeLease(now, now.Add(50*time.Second))}
	rev, err := d.turns.create(ctx, turn)
	if err != nil {
		t.Fatal(err)
	}
	d.gather.takeIn(turn, rev)
	publishResult(t, js, c, "sunny")
	testutil.WaitForWhat(t, 10*time.Second, "the turn to be submitted from the new stream's first result", func() bool {
		have, _, err := d.turns.get(ctx, key)
		return err == nil && have.State == TurnSubmitted
	})
}

// A side-effecting run belongs in the audit trail whichever replica it
// reaches: one whose turn another replica owns, and whose results this
// replica otherwise passes by, is audited here too (the entry's message
// ID keeps one), so that an owner killed before it audited the run leaves
// no gap.
func TestASideEffectingRunIsAuditedByAReplicaThatPassesItsTurnBy(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "one")
	d.registry.mu.Lock()
	d.registry.owners["charge"] = &protocol.FunctionSpec{Version: protocol.Version, Name: "charge", Team: "geo", SideEffects: true}
	d.registry.mu.Unlock()
	if _, err := d.gather.streams.stream(ctx, "geo"); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	key := protocol.TurnKey(fmt.Sprintf("%032x", 7))
	quiet := TurnCall{ID: "call_1", Name: "get_weather", Key: key.Call("call_1"), Team: "geo"}
	charge := TurnCall{ID: "call_2", Name: "charge", Key: key.Call("call_2"), Team: "geo", SideEffects: true}
	turn := &Turn{Version: 1, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_charge"},
		State: TurnCollecting, Calls: []TurnCall{quiet, charge}, CreatedAt: now, ExpiresAt: now.Add(time.Minute), Deadline: now.Add(50 * time.Second),
		lease: lifecycle.Lease{Owner: "two/live", Until: now.Add(lifecycle.LeaseFor), Epoch: 1}}
	if _, err := d.turns.create(ctx, turn); err != nil {
		t.Fatal(err)
	}
	publishResult(t, js, quiet, "sunny") // the turn is passed by from here
	publishResult(t, js, charge, "charged")
	audit, err := js.Stream(ctx, provision.AuditStream)
	if err != nil {
		t.Fatal(err)
	}
	var entry AuditEntry
	testutil.WaitForWhat(t, 10*time.Second, "the run to be audited", func() bool {
		m, err := audit.GetLastMsgForSubject(ctx, provision.AuditSubjectPrefix+".geo.run")
		return err == nil && json.Unmarshal(m.Data, &entry) == nil
	})
	if entry.CallKey != charge.Key || entry.Platform != protocol.PlatformResponses || entry.Outcome != "ok" {
		t.Fatalf("audit entry %+v; want the run of %s on responses, ok", entry, charge.Key)
	}
	if d.gather.tracking(key) {
		t.Fatal("the replica gathers for a turn another owns")
	}
}
