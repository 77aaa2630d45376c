package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// curveMCP: a no-op tools/call through the dispatcher's /mcp against the
// same no-op on a bare go-sdk MCP server in process (the MCP floor: the
// same SDK, stateless Streamable HTTP, nothing behind the tool), with 1, 8
// and 64 clients each calling in a closed loop.
func curveMCP(ctx context.Context, cfg config, c *curve) error {
	c.title, c.size, c.logX = "MCP clients", "concurrent clients", true
	c.cols = []column{
		{"bare go-sdk server (calls/s)", true}, {"toolrelay /mcp (calls/s)", true}, {"toolrelay ÷ bare", false},
		{"bare p50 (ms)", false}, {"bare p99 (ms)", false}, {"toolrelay p50 (ms)", true}, {"toolrelay p99 (ms)", false},
	}
	window := 6 * time.Second
	if cfg.quick {
		window = 900 * time.Millisecond
	}
	_, env, done, err := freshServer(ctx, "mcp")
	if err != nil {
		return err
	}
	defer done()
	s, err := newStack(ctx, env, 1, noop)
	if err != nil {
		return err
	}
	defer s.stop()
	relay := httptest.NewServer(frontDoor(s.d))
	defer relay.Close()
	bare := httptest.NewServer(bareMCP())
	defer bare.Close()
	clients := []int{1, 8, 64}
	if cfg.quick {
		clients = []int{1, 8}
	}
	for _, n := range clients {
		// In turns, a third of the window each, so that a change in
		// what else the machine runs weighs on both alike.
		var b, t float64
		var bl, tl latencies
		for range 3 {
			r, l, err := mcpLoad(ctx, bare.URL+"/mcp", n, window/3)
			if err != nil {
				return fmt.Errorf("bare, %d clients: %w", n, err)
			}
			b, bl = b+r/3, append(bl, l...)
			if r, l, err = mcpLoad(ctx, relay.URL+"/mcp", n, window/3); err != nil {
				return fmt.Errorf("toolrelay, %d clients: %w", n, err)
			}
			t, tl = t+r/3, append(tl, l...)
		}
		c.add(float64(n), "", b, t, t/b, msf(bl.pct(50)), msf(bl.pct(99)), msf(tl.pct(50)), msf(tl.pct(99)))
	}
	c.note("Each client is an MCP client session of the official Go SDK calling `noop` in a closed loop for %s, in three turns alternating with the other server; the bare server is "+
		"mcp.NewStreamableHTTPHandler, stateless, with one tool whose handler returns at once, in the bench's process like the "+
		"dispatcher's. toolrelay's /mcp runs each call as a single-call turn on the fleet (JetStream server in a process of its own, "+
		"one executor). 64 clients are toolrelay's limit of running calls per caller (TOOLRELAY_MAX_MCP_CALLS_PER_CALLER; loopback "+
		"clients without tokens are one caller).", window)
	return nil
}

// bareMCP is the MCP floor: the SDK's stateless Streamable HTTP handler
// with one no-op tool.
func bareMCP() http.Handler {
	srv := mcp.NewServer(&mcp.Implementation{Name: "bare", Version: "1"}, nil)
	type args struct {
		OrderID string `json:"order_id"`
	}
	mcp.AddTool(srv, &mcp.Tool{Name: "noop", Description: "does nothing"},
		func(context.Context, *mcp.CallToolRequest, args) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: `{"status":"shipped"}`}}}, nil, nil
		})
	mux := http.NewServeMux()
	mux.Handle("/mcp", mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{Stateless: true}))
	return mux
}

// mcpLoad runs n clients, each calling noop at url in a closed loop, for
// window; it returns the calls per second and their latencies.
func mcpLoad(ctx context.Context, url string, n int, window time.Duration) (float64, latencies, error) {
	sessions := make([]*mcp.ClientSession, n)
	for i := range sessions {
		s, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url}, nil)
		if err != nil {
			return 0, nil, err
		}
		defer s.Close()
		sessions[i] = s
	}
	call := func(s *mcp.ClientSession) error {
		res, err := s.CallTool(ctx, &mcp.CallToolParams{Name: "noop", Arguments: map[string]any{"order_id": "A-1001"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("tools/call noop: isError: %v", res.Content)
		}
		return err
	}
	for _, s := range sessions { // warm up: connections, the registry
		for range 5 {
			if err := call(s); err != nil {
				return 0, nil, err
			}
		}
	}
	var mu sync.Mutex
	var all latencies
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(window)
	for _, s := range sessions {
		wg.Go(func() {
			var lat latencies
			for time.Now().Before(end) && failed.Load() == nil {
				t0 := time.Now()
				if err := call(s); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				lat = append(lat, time.Since(t0))
			}
			mu.Lock()
			all = append(all, lat...)
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := failed.Load(); err != nil {
		return 0, nil, *err
	}
	return float64(len(all)) / time.Since(start).Seconds(), all, nil
}
