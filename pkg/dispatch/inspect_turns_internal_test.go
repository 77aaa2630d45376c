package dispatch

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The page of open turns nearest their deadline is the first limit turns
// of them all sorted by deadline (then key), whatever their order, ties
// and number.
func TestNearestDeadlineIsThePageOfTheSortedTurns(t *testing.T) {
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name          string
		n, limit      int
		distinctTimes int
	}{
		{"fewer than the page", 5, 10, 5},
		{"exactly the page", 10, 10, 10},
		{"many, one page", 1000, 50, 1000},
		{"many ties", 1000, 50, 7},
		{"page of one", 300, 1, 300},
		{"no limit", 300, 0, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(tc.n), uint64(tc.limit)))
			var open []*Turn
			for i := range tc.n {
				open = append(open, &Turn{Key: protocol.TurnKey("responses.resp_" + strconv.Itoa(i)),
					Deadline: start.Add(time.Duration(r.IntN(tc.distinctTimes)) * time.Second)})
			}
			r.Shuffle(len(open), func(i, j int) { open[i], open[j] = open[j], open[i] })
			want := slices.Clone(open)
			slices.SortFunc(want, byDeadline)
			if tc.limit > 0 && len(want) > tc.limit {
				want = want[:tc.limit]
			}
			keys := func(ts []*Turn) []protocol.TurnKey {
				var out []protocol.TurnKey
				for _, t := range ts {
					out = append(out, t.Key)
				}
				return out
			}
			if diff := cmp.Diff(keys(want), keys(nearestDeadline(open, tc.limit))); diff != "" {
				t.Errorf("nearestDeadline(%d turns, %d) (-want +got):\n%s", tc.n, tc.limit, diff)
			}
		})
	}
}
