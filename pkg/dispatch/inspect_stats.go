package dispatch

import (
	"slices"
	"sync"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// fnStats keeps, per function, the latest results this replica gathered:
// the figures GET /v1/functions reports beside the metrics (which
// Prometheus aggregates over every replica). Replicas share the results
// consumer, so each sees a share of the calls.
type fnStats struct {
	mu  sync.Mutex
	fns map[string]*sampleRing // by function name
}

// statsSamples is how many results are kept per function; statsWindow is
// the span figures are computed over.
const (
	statsSamples = 1024
	statsWindow  = 5 * time.Minute
)

type sample struct {
	at        time.Time
	duration  time.Duration
	queueWait time.Duration
	failed    bool
}

type sampleRing struct {
	buf  []sample
	next int
}

func newFnStats() *fnStats { return &fnStats{fns: map[string]*sampleRing{}} }

// record notes a result of turn t.
func (s *fnStats) record(t *Turn, res *protocol.Result) {
	sm := sample{at: time.Now(), failed: res.Error != nil}
	if !res.StartedAt.IsZero() {
		sm.duration = max(res.FinishedAt.Sub(res.StartedAt), 0)
		sm.queueWait = max(res.StartedAt.Sub(t.CreatedAt), 0)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.fns[res.Function]
	if r == nil {
		r = &sampleRing{}
		s.fns[res.Function] = r
	}
	if len(r.buf) < statsSamples {
		r.buf = append(r.buf, sm)
		return
	}
	r.buf[r.next] = sm
	r.next = (r.next + 1) % statsSamples
}

// FunctionStats are the figures of one function's latest results on this
// replica (at most 1024 of them, within the last 5 minutes).
type FunctionStats struct {
	// Window is the span the figures cover, and Results how many results
	// it holds.
	Window  string `json:"window"`
	Results int    `json:"results"`
	// PerMinute is the rate of results over the window.
	PerMinute float64 `json:"per_minute"`
	// ErrorShare is the share of failed results, 0 to 1.
	ErrorShare float64 `json:"error_share"`
	// P50 and P99 are how long the function ran; QueueWaitP50 how long
	// calls waited from intake to an executor starting them.
	P50          string `json:"p50,omitempty"`
	P99          string `json:"p99,omitempty"`
	QueueWaitP50 string `json:"queue_wait_p50,omitempty"`
}

func (s *fnStats) of(function string) FunctionStats {
	now := time.Now()
	var in []sample
	s.mu.Lock()
	if r := s.fns[function]; r != nil {
		for _, sm := range r.buf {
			if now.Sub(sm.at) <= statsWindow {
				in = append(in, sm)
			}
		}
	}
	s.mu.Unlock()
	st := FunctionStats{Window: statsWindow.String(), Results: len(in)}
	if len(in) == 0 {
		return st
	}
	oldest := now
	var failed int
	durs := make([]time.Duration, 0, len(in))
	waits := make([]time.Duration, 0, len(in))
	for _, sm := range in {
		if sm.at.Before(oldest) {
			oldest = sm.at
		}
		if sm.failed {
			failed++
		}
		durs = append(durs, sm.duration)
		waits = append(waits, sm.queueWait)
	}
	span := max(now.Sub(oldest), time.Minute)
	if len(in) == statsSamples { // the ring is full: the window is what it holds
		st.Window = span.Round(time.Second).String()
	} else {
		span = statsWindow
	}
	st.PerMinute = float64(len(in)) / span.Minutes()
	st.ErrorShare = float64(failed) / float64(len(in))
	st.P50, st.P99 = quantile(durs, 0.5), quantile(durs, 0.99)
	st.QueueWaitP50 = quantile(waits, 0.5)
	return st
}

// quantile returns the q-quantile of ds (which it sorts), rounded for
// people.
func quantile(ds []time.Duration, q float64) string {
	slices.Sort(ds)
	d := ds[min(int(q*float64(len(ds))), len(ds)-1)]
	return d.Round(time.Microsecond * 100).String()
}
