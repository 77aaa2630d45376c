package lifecycle

import (
	"context"
	"testing"
	"time"
)

// staleEnv keeps, as a process does between events, a copy of a record
// older than the store's.
type staleEnv struct {
	*reviewEnv
	kept *Rec
}

func (e *staleEnv) Cached(string) *Rec { return e.kept.Clone() }

// A turn whose lease this process last saw held by another is read again
// before the process waits for that lease to lapse: its owner may have
// released it since (it stopped), and the turn is then this process's to
// take at once, not 17 s later. The replica that takes a stopped one's watch
// over mid-intake waited so (TestAWatchTakenOverMidIntakeSendsItsCalls
// failed under load).
func TestAReleasedLeaseSeenStaleIsReadAgain(t *testing.T) {
	env := &reviewEnv{ctx: context.Background(), now: simStart, store: map[string]*Rec{}, rev: 10}
	released := &Rec{Key: "t1", State: Collecting, Deadline: simStart.Add(time.Minute), Lease: Lease{Epoch: 1}, Rev: 10}
	env.store["t1"] = released
	kept := released.Clone()
	kept.Rev, kept.Lease = 9, Lease{Owner: "stopped", Until: simStart.Add(LeaseFor), Epoch: 1}
	e := New("me", &staleEnv{env, kept}, nil)
	e.Close("t1")
	env.wg.Wait()
	r := env.stored("t1")
	if r.State != Submitted || r.Lease.Owner != "me" || env.submits != 1 {
		t.Fatalf("record %s, lease %s, %d submissions; want submitted once by me, the released lease taken at once", r.State, r.Lease, env.submits)
	}
}
