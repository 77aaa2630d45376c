package dispatch

import (
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

// Instance is, for tests, the owner d writes in the leases it takes.
func Instance(d *Dispatcher) string { return d.instance }

// LeaseOf is, for tests, the owner and epoch of t's lease.
func LeaseOf(t *Turn) (owner string, epoch uint64) { return t.lease.Owner, t.lease.Epoch }
