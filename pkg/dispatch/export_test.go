package dispatch

import (
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Tracking reports, for tests, whether d gathers results for the turn.
func Tracking(d *Dispatcher, key protocol.TurnKey) bool { return d.gather.tracking(key) }

// LiveSchemas is, for tests, how many distinct schemas the live executors
// of a function declare in d's view of the registry (0: none serves it).
func LiveSchemas(d *Dispatcher, function string) int {
	for _, f := range d.registry.fleet() {
		if f.function == function {
			return int(f.schemas)
		}
	}
	return 0
}

// HoldFor sets, for tests, how long d holds a turn before releasing it
// (which is how often its submissions renew their claims) and how often it
// looks for holds to release. Call it before Run.
func HoldFor(d *Dispatcher, hold, scan time.Duration) {
	d.claimRenewEvery, d.holdScanEvery = hold, scan
}

// NudgeSubject is, for tests, where d hears of the results of the turns
// it holds that another replica received.
func NudgeSubject(d *Dispatcher) string { return nudgeSubject(d.holdOutcome.Holder) }
