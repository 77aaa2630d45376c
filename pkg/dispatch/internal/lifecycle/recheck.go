package lifecycle

import "time"

// A process's sweep finds what another process left stuck: a turn whose
// owner died with its results all in, or mid-submission. Reading the
// record of every open turn on every sweep is what made the sweep cost
// grow with the open turns, so a process reads the record of a turn it
// tracks (it holds a copy: it took the turn in, or saw a result of it)
// only when its copy shows the turn due a look (SweepReads), and has its
// engine look again at the others when RecheckDue says so. A turn it
// does not track it reads on every sweep: that is the turn a dead
// process left, which the others learn of only so.

// RecheckEvery is the longest gap between two re-checks of a turn a
// process tracks.
const RecheckEvery = 2 * time.Minute

// RecheckDue reports whether a tracked turn, open for age and last swept
// sinceLast ago, is due a re-check: when its age passes LeaseFor, then
// twice that, four times... until the gap is RecheckEvery, and every
// RecheckEvery after (at 15 s, 30 s, 1 min, 2 min, 4 min...). A sweep
// that does not know when it last ran passes a large sinceLast: every
// turn older than LeaseFor is due.
func RecheckDue(age, sinceLast time.Duration) bool {
	for at := LeaseFor; at <= age; at = min(2*at, at+RecheckEvery) {
		if age-sinceLast < at {
			return true
		}
	}
	return false
}

// SweepReads reports whether a sweep reads the record of a turn the
// process tracks, from its copy's state and deadline: on every sweep once
// the copy shows the turn past its deadline or no longer collecting — a
// turn its owner should have closed by now, or one a lease may lapse on,
// whose take-over must not wait. Before its deadline a turn collecting
// can only be stuck by a process that died with its results all in (or
// the last of them seen only there): the sweep reads nothing of it, and
// has the engine look at it (Close) when its re-check is due
// (RecheckDue); the engine reads what it needs, and a write of a record
// that changed meanwhile fails its compare-and-set and reads it again.
func SweepReads(state State, deadline, now time.Time) bool {
	return state != Collecting || !now.Before(deadline)
}
