package httpapi

import "sync"

// Default limits per caller (see [Options]).
const (
	// DefaultMaxStreamsPerCaller is the default of [Options.MaxStreamsPerCaller]:
	// a few console tabs and MCP listeners per token.
	DefaultMaxStreamsPerCaller = 16
	// DefaultMaxMCPCallsPerCaller is the default of
	// [Options.MaxMCPCallsPerCaller]: a busy agent deployment's parallel
	// tool calls; 100 tokens at it stay within the dispatcher's own
	// in-flight limit per team.
	DefaultMaxMCPCallsPerCaller = 64
)

// perCaller counts what each caller holds at once and refuses past a
// limit. A caller is a token's name, or "loopback" for every loopback
// client of a dispatcher without tokens. It is safe for concurrent use.
type perCaller struct {
	limit int
	mu    sync.Mutex
	held  map[string]int
}

func newPerCaller(limit int) *perCaller {
	return &perCaller{limit: limit, held: map[string]int{}}
}

// acquire takes one for caller, or reports false if caller holds the
// limit already. Each true is followed by one release.
func (p *perCaller) acquire(caller string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[caller] >= p.limit {
		return false
	}
	p.held[caller]++
	return true
}

func (p *perCaller) release(caller string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[caller]--; p.held[caller] <= 0 {
		delete(p.held, caller)
	}
}
