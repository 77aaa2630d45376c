package main

import (
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/toolrelay/toolrelay/internal/platformsim"
)

// The functions, of every kind the soak covers (and, in goexec.go, the Go
// functions refund, with side effects and Reconcile, and tally):
//
//	orders:  charge  (HTTP, side effects: the effect log counts each run)
//	         lookup  (command)
//	         slow    (command, 1.5 s)
//	billing: quote   (command)
//	         flaky   (HTTP; a third of attempts answer 503, retried)
//	         refuse  (command exiting 1: a failed call the model reads)
func writeFunctions(dir, team, fnURL string) (string, error) {
	var body string
	switch team {
	case "orders":
		body = fmt.Sprintf(`functions:
  - name: charge
    description: Charge an order once.
    owner: orders
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    timeout: 10s
    side_effects: true
    http: {url: "%s/charge"}
  - name: lookup
    owner: orders
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    timeout: 10s
    command: ["sh", "-c", "cat >/dev/null; echo found"]
  - name: slow
    owner: orders
    parameters: {type: object}
    timeout: 20s
    command: ["sh", "-c", "cat >/dev/null; sleep 1.5; echo slow-done"]
`, fnURL)
	case "billing":
		body = fmt.Sprintf(`functions:
  - name: quote
    owner: billing
    parameters: {type: object, properties: {order: {type: string}}, required: [order]}
    timeout: 10s
    command: ["sh", "-c", "cat >/dev/null; echo 42.00"]
  - name: flaky
    owner: billing
    parameters: {type: object}
    timeout: 10s
    http: {url: "%s/flaky"}
  - name: refuse
    owner: billing
    parameters: {type: object}
    timeout: 10s
    command: ["sh", "-c", "cat >/dev/null; echo 'no such customer' >&2; exit 1"]
`, fnURL)
	}
	path := filepath.Join(dir, team+".yaml")
	return path, os.WriteFile(path, []byte(body), 0o644)
}

// scenarios are what the model does; each platform plays all of them.
func scenarios() []platformsim.Scenario {
	return []platformsim.Scenario{
		{Name: "pay", Prompt: "chaos pay",
			Steps: []platformsim.Step{
				{{Name: "charge", Arguments: `{"order":"A-1"}`}, {Name: "lookup", Arguments: `{"order":"A-1"}`}},
				{{Name: "quote", Arguments: `{"order":"A-1"}`}},
			},
			Answer: `{{out "charge"}} / {{out "lookup"}} / {{out "quote"}}`},
		{Name: "refund", Prompt: "chaos refund",
			Steps:  []platformsim.Step{{{Name: "refund", Arguments: `{"order":"R-1"}`}, {Name: "tally", Arguments: `{}`}}},
			Answer: `{{out "refund"}} / {{out "tally"}}`},
		{Name: "mixed", Prompt: "chaos mixed",
			Steps:  []platformsim.Step{{{Name: "slow", Arguments: `{}`}, {Name: "flaky", Arguments: `{}`}, {Name: "refuse", Arguments: `{}`}}},
			Answer: `{{out "slow"}} / {{out "flaky"}} / {{out "refuse"}}`},
	}
}

var prompts = []string{"chaos pay", "chaos mixed", "chaos refund"}

// effectLog is the side-effect function's own record: each run of charge,
// by call ID, as the function saw it (not as toolrelay reports it).
type effectLog struct {
	mu     sync.Mutex
	runs   map[string]int // call ID → effects (call IDs are unique across functions)
	flakyN atomic.Int64
}

func newEffectLog() *effectLog { return &effectLog{runs: map[string]int{}} }

func (l *effectLog) handler() http.Handler {
	mux := http.NewServeMux()
	// charge (HTTP) and refund (Go) have the effect; refund's Reconcile
	// hook asks GET /refunded whether one happened.
	effect := func(done string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("Toolrelay-Call-Id")
			l.mu.Lock()
			l.runs[id]++
			l.mu.Unlock()
			fmt.Fprintf(w, "%s %s", done, id)
		}
	}
	mux.HandleFunc("POST /charge", effect("charged"))
	mux.HandleFunc("POST /refund", effect("refunded"))
	mux.HandleFunc("GET /refunded", func(w http.ResponseWriter, r *http.Request) {
		id := r.URL.Query().Get("id")
		l.mu.Lock()
		n := l.runs[id]
		l.mu.Unlock()
		if n == 0 {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "refunded %s", id)
	})
	mux.HandleFunc("POST /flaky", func(w http.ResponseWriter, r *http.Request) {
		if l.flakyN.Add(1)%3 == 0 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprint(w, "flaky-ok")
	})
	return mux
}

// effects returns the effects by call ID.
func (l *effectLog) effects() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.runs)
}

// faultyPlatform answers the dispatchers with 429 or 500 while told to;
// the soak's own requests (header X-Chaos-Driver) always pass.
type faultyPlatform struct {
	next http.Handler
	mode atomic.Int32
	hits atomic.Int64
}

const (
	platformOK int32 = iota
	platform429
	platform500
)

func (p *faultyPlatform) set(mode int32) { p.mode.Store(mode) }

func (p *faultyPlatform) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("X-Chaos-Driver") == "" {
		switch p.mode.Load() {
		case platform429:
			p.hits.Add(1)
			w.Header().Set("Retry-After", "1")
			http.Error(w, `{"error":{"message":"Rate limit reached (chaos)","type":"rate_limit_exceeded"}}`, http.StatusTooManyRequests)
			return
		case platform500:
			p.hits.Add(1)
			http.Error(w, `{"error":{"message":"The server had an error (chaos)","type":"server_error"}}`, http.StatusInternalServerError)
			return
		}
	}
	p.next.ServeHTTP(w, r)
}

// isEffect reports whether a side-effect function's output says the effect
// happened.
func isEffect(output string) bool {
	return strings.HasPrefix(output, "charged ") || strings.HasPrefix(output, "refunded ")
}

// sideEffect reports whether fn is one of the soak's side-effect functions.
func sideEffect(fn string) bool { return fn == "charge" || fn == "refund" }
