//go:build race

package lifecycle

// raceEnabled: under the race detector the simulation runs fewer seeds
// (its threads run one at a time, so the detector adds cost, not
// findings); CI runs every seed without it (.ci/run).
const raceEnabled = true
