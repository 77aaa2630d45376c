package dispatch

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// countingPlatform counts the submissions it takes, by the lease they
// went out under.
type countingPlatform struct {
	idlePlatform
	mu    sync.Mutex
	by    []string
	turns []protocol.TurnKey
}

func (p *countingPlatform) Submit(_ context.Context, t *Turn, _ []Output) (*Submission, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.by = append(p.by, t.lease.Owner)
	p.turns = append(p.turns, t.Key)
	return &Submission{}, nil
}

func (p *countingPlatform) submissions() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.by...)
}

// leasedTurn records a turn with no calls (so its results are all in)
// whose lease is l, and returns it with its revision.
func leasedTurn(t *testing.T, d *Dispatcher, key protocol.TurnKey, l lifecycle.Lease) (*Turn, uint64) {
	t.Helper()
	now := time.Now().UTC()
	turn := &Turn{Version: protocol.Version, Key: key, Ref: Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_" + string(key)},
		State: TurnCollecting, lease: l, CreatedAt: now, ExpiresAt: now.Add(5 * time.Minute), Deadline: now.Add(4 * time.Minute)}
	rev, err := d.turns.create(t.Context(), turn)
	if err != nil {
		t.Fatal(err)
	}
	return turn, rev
}

func closedRecord(t *testing.T, d *Dispatcher, key protocol.TurnKey) *Turn {
	t.Helper()
	var have *Turn
	testutil.WaitForWhat(t, 20*time.Second, "the turn's record to say it is closed", func() bool {
		r, _, err := d.turns.get(t.Context(), key)
		have = r
		return err == nil && !r.Open()
	})
	return have
}

// A replica with news of a turn another replica owns (a result, the
// deadline) tells the owner, which submits it; the other never does.
func TestATurnOwnedElsewhereIsSubmittedByItsOwner(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &countingPlatform{}
	owner := replicaOn(t, js, "owner", p)
	other := replicaOn(t, js, "other", p)
	key := protocol.TurnKey("0123456789abcdef0123456789abcdef")
	turn, rev := leasedTurn(t, other, key, lifecycle.Lease{Owner: owner.instance, Until: time.Now().Add(lifecycle.LeaseFor), Epoch: 1})
	other.gather.track(turn, rev)
	other.engine.Close(string(key))

	have := closedRecord(t, other, key)
	if have.State != TurnSubmitted || have.lease.Owner != owner.instance || have.lease.Epoch != 1 {
		t.Fatalf("the record is %s, lease %s; want submitted by its owner %s under the lease it was taken in with", have.State, have.lease, owner.instance)
	}
	if got := p.submissions(); len(got) != 1 || got[0] != owner.instance {
		t.Fatalf("submissions by %q; want one, by the owner %s", got, owner.instance)
	}
}

// A turn whose owner went without releasing it (killed) is taken over once
// its lease lapses: a new epoch, submitted once.
func TestATurnWhoseOwnerWentIsTakenOver(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &countingPlatform{}
	d := replicaOn(t, js, "taker", p)
	key := protocol.TurnKey("fedcba9876543210fedcba9876543210")
	gone := lifecycle.Lease{Owner: "killed/0123456789ab", Until: time.Now().Add(-lifecycle.Skew - time.Second), Epoch: 4}
	turn, rev := leasedTurn(t, d, key, gone)
	d.gather.track(turn, rev)
	d.engine.Close(string(key))

	have := closedRecord(t, d, key)
	if have.State != TurnSubmitted || have.lease.Owner != d.instance || have.lease.Epoch != 5 {
		t.Fatalf("the record is %s, lease %s; want submitted by %s at epoch 5", have.State, have.lease, d.instance)
	}
	if got := p.submissions(); len(got) != 1 {
		t.Fatalf("%d submissions, want 1", len(got))
	}
}

// A lease that has not lapsed by Skew is not taken: the turn waits for
// its owner, here gone, until then.
func TestALeaseIsNotTakenBeforeItLapses(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	p := &countingPlatform{}
	d := replicaOn(t, js, "taker", p)
	key := protocol.TurnKey("00112233445566778899aabbccddeeff")
	until := time.Now().Add(time.Second)
	turn, rev := leasedTurn(t, d, key, lifecycle.Lease{Owner: "paused/0123456789ab", Until: until, Epoch: 1})
	d.gather.track(turn, rev)
	d.engine.Close(string(key))

	have := closedRecord(t, d, key)
	if at := have.Outcome().SubmittedAt; at.Before(until.Add(lifecycle.Skew)) {
		t.Fatalf("submitted at %s, before the lease lapsed by Skew (%s)", at, until.Add(lifecycle.Skew))
	}
	if have.lease.Owner != d.instance || have.lease.Epoch != 2 {
		t.Fatalf("lease %s; want taken over by %s at epoch 2", have.lease, d.instance)
	}
}

// A replica that stops releases the leases of the turns it works on, so
// that the others take them at once.
func TestAStoppingReplicaReleasesItsLeases(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d, err := New(js, []Platform{idlePlatform{}}, Options{Name: "stopping", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	testutil.WaitForWhat(t, 30*time.Second, "the dispatcher to be ready", d.Ready)

	key := protocol.TurnKey("aabbccddeeff00112233445566778899")
	turn, rev := leasedTurn(t, d, key, lifecycle.Lease{Owner: d.instance, Until: time.Now().Add(lifecycle.LeaseFor), Epoch: 1})
	turn.Calls = []TurnCall{{ID: "c", Name: "f", Key: key.Call("c"), Team: "t", Arguments: json.RawMessage(`{}`)}}
	if rev, err = d.turns.update(t.Context(), turn, rev); err != nil {
		t.Fatal(err)
	}
	d.gather.track(turn, rev)
	cancel()
	<-done

	have, _, err := d.turns.get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if have.State != TurnCollecting || have.lease.Owner != "" || have.lease.Epoch != 1 {
		t.Fatalf("after the stop the record is %s, lease %s; want collecting, released at epoch 1", have.State, have.lease)
	}
}

// Records of the version before the lease read as leases, and a leased
// turn is written in the fields that version reads: it leaves a turn alone
// while its lease holds (docs/turns.md, rolling upgrades).
func TestRecordsOfTheVersionBeforeTheLease(t *testing.T) {
	created := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name, record string
		state        TurnState
		lease        lifecycle.Lease
	}{
		{"a hold", `{"v":1,"key":"0123456789abcdef0123456789abcdef","state":"submitting","owner":"old-1","holder":"h1","held":true,"submitting_since":"2026-12-05T12:09:15Z","created_at":"2026-12-05T12:00:00Z","deadline":"2026-12-05T12:09:30Z"}`,
			TurnCollecting, lifecycle.Lease{Owner: "old:old-1/h1", Until: created.Add(lifecycle.LeaseFor), Epoch: 1}},
		{"a claim", `{"v":1,"key":"0123456789abcdef0123456789abcdef","state":"submitting","owner":"old-1","submitting_since":"2026-12-05T12:01:00Z","created_at":"2026-12-05T12:00:00Z"}`,
			TurnSubmitting, lifecycle.Lease{Owner: "old:old-1", Until: created.Add(time.Minute + lifecycle.LeaseFor), Epoch: 1}},
		{"a claim released", `{"v":1,"key":"0123456789abcdef0123456789abcdef","state":"submitting","created_at":"2026-12-05T12:00:00Z"}`,
			TurnSubmitting, lifecycle.Lease{Epoch: 1}},
		{"a turn collecting", `{"v":1,"key":"0123456789abcdef0123456789abcdef","state":"collecting","created_at":"2026-12-05T12:00:00Z"}`,
			TurnCollecting, lifecycle.Lease{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			turn, err := decodeTurn([]byte(tc.record))
			if err != nil {
				t.Fatal(err)
			}
			if turn.State != tc.state || !turn.lease.Equal(tc.lease) {
				t.Fatalf("read as %s, lease %s; want %s, lease %s", turn.State, turn.lease, tc.state, tc.lease)
			}
		})
	}

	// A turn collecting under a lease is written as that version's hold,
	// dated so that it takes it over only once it is due.
	deadline := created.Add(9*time.Minute + 30*time.Second)
	leased := &Turn{Version: 1, Key: "0123456789abcdef0123456789abcdef", State: TurnCollecting, CreatedAt: created, Deadline: deadline,
		lease: lifecycle.Lease{Owner: "new-1/abcdef012345", Until: created.Add(lifecycle.LeaseFor), Epoch: 1}}
	var old struct {
		State           string    `json:"state"`
		Owner           string    `json:"owner"`
		Held            bool      `json:"held"`
		Holder          string    `json:"holder"`
		SubmittingSince time.Time `json:"submitting_since"`
	}
	if err := json.Unmarshal(mustMarshal(t, leased), &old); err != nil {
		t.Fatal(err)
	}
	if old.State != "submitting" || !old.Held || old.Owner != "new-1" || old.Holder != "abcdef012345" || !old.SubmittingSince.Equal(deadline.Add(-lifecycle.LeaseFor)) {
		t.Fatalf("the version before the lease reads %+v; want a hold of new-1/abcdef012345 since %s", old, deadline.Add(-lifecycle.LeaseFor))
	}
}
