package main

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// measureMCP: a no-op tools/call through the dispatcher's /mcp, closed
// loop, with the official MCP client on one session: the MCP front door's
// round trip (HTTP, JSON-RPC, then the same turn path as a platform call),
// beside NATS micro's in the same table.
func measureMCP(ctx context.Context, cfg config, r *report) error {
	env, err := startNATS(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	s, err := newStack(ctx, env, 1, noop)
	if err != nil {
		return err
	}
	defer s.stop()
	hs := httptest.NewServer(frontDoor(s.d))
	defer hs.Close()
	session, err := mcp.NewClient(&mcp.Implementation{Name: "bench", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: hs.URL + "/mcp"}, nil)
	if err != nil {
		return err
	}
	defer session.Close()
	call := func() error {
		res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: "noop", Arguments: map[string]any{"order_id": "A-1001"}})
		if err == nil && res.IsError {
			err = fmt.Errorf("tools/call noop: isError: %v", res.Content)
		}
		return err
	}
	for range 20 { // warm up: connections, the registry, the first turn
		if err := call(); err != nil {
			return err
		}
	}
	lat, err := closedLoop(cfg.samples, call)
	if err != nil {
		return err
	}
	r.mcpLat = lat
	fmt.Printf("   tools/call round trip p50 %.3fms\n", msf(lat.pct(50)))
	return nil
}
