// Package lifecycle decides who may submit a turn, and when: the one
// ownership concept of the dispatcher, a lease on the turn's record.
//
// A turn's record carries its state (collecting, submitting, submitted,
// failed) and a [Lease]: the process that owns the turn, until when, and
// an epoch that rises whenever the owner changes. Every change of the
// record is a compare-and-set on its revision, so of two processes that
// act on the same revision exactly one wins.
//
// The rules (docs/turns.md has the model, its diagram and the windows it
// leaves):
//   - the process that takes a turn in owns it from the start: its record
//     is created with a lease of [LeaseFor];
//   - a process submits only while it holds the lease with at least
//     [Ahead] left; with less, it renews the lease (a write) first, and a
//     renewal that loses the compare-and-set ends its part in the turn;
//   - a turn whose results are all in is submitted by its owner with no
//     write before, while the lease taken at intake lasts; any other
//     submission (a cut-off at the deadline, a turn taken over, a lease
//     renewed) first writes the record as submitting, with the cut-off's
//     decision in it, so a repeat submits exactly the same outputs;
//   - another process takes the lease over only once it has lapsed by
//     [Skew]; a stopping process releases its leases;
//   - the owner records the outcome; an outcome found written by another
//     process ends the turn here too.
//
// The [Engine] runs these rules for the turns one process works on. Every
// event of a turn in that process (its results are in, its deadline came,
// a cancellation, a look from the sweep, the process stopping) is handled
// by one goroutine at a time, in order: no two goroutines of a process
// ever act on one turn together. The engine does no I/O of its own: its
// [Env] reads and writes records, submits, and keeps time, which lets a
// deterministic simulation run several processes' engines against a
// simulated store under a seeded scheduler (sim_test.go).
//
// # Glossary
//
//   - turn: the calls a model asked for in one go, submitted together.
//   - record: the turn's entry in the turn bucket, changed by
//     compare-and-set on its revision.
//   - lease: the right to submit a turn and write its record; owner,
//     until, epoch.
//   - owner: the process instance holding the lease.
//   - epoch: a number that rises on every change of owner.
//   - take over: acquire a lease another process let lapse.
//   - release: give a lease up (owner cleared), at shutdown.
//   - cut-off: closing a turn at its deadline, with a "timed out" failure
//     for each call without a result.
//   - close: submit a turn and record the outcome, or fail it.
//     [Engine.Close] asks the engine to look at a turn, which closes it
//     if its results are all in or its deadline came and this process
//     may.
//   - re-check: a sweep asking the engine to look again ([Engine.Close])
//     at a turn the process tracks, at the ages [RecheckDue] names; the
//     sweep reads such a turn's record only when the process's copy of it
//     says so ([SweepReads]).
package lifecycle
