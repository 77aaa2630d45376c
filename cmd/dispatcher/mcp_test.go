package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
)

// The built dispatcher serves /mcp: two replicas, an executor process
// serving command functions from a functions file, the official MCP
// client, and the simulator playing a Responses request with an mcp tool.
// TOOLRELAY_MCP_CALL_TIMEOUT caps a call's deadline.
func TestBuiltDispatcherServesMCP(t *testing.T) {
	w := newWorld(t, platformsim.Scenario{Name: "nickname", Prompt: "nickname of seattle",
		Steps: []platformsim.Step{{{Name: "nickname", Arguments: `{"city":"Seattle"}`}}}, Answer: `It is {{out "nickname"}}.`})
	cfg := filepath.Join(w.dir, "functions.yaml")
	body := "functions:\n" +
		"  - name: nickname\n    owner: cities\n    description: The nickname of a city.\n" +
		"    parameters: {type: object, properties: {city: {type: string}}, required: [city]}\n" +
		"    command: [\"sh\", \"-c\", \"printf 'The Emerald City'\"]\n" +
		"  - name: wait\n    owner: cities\n    timeout: 30s\n    parameters: {type: object}\n" +
		"    command: [\"sleep\", \"30\"]\n"
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	replicas := []*proc{w.dispatcher("d1", "TOOLRELAY_MCP_CALL_TIMEOUT=1s"), w.dispatcher("d2", "TOOLRELAY_MCP_CALL_TIMEOUT=1s")}
	w.executor("exec-1", "-config", cfg) // it declares its functions to a dispatcher
	ctx := t.Context()
	session := func(p *proc) *mcp.ClientSession {
		s, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).
			Connect(ctx, &mcp.StreamableClientTransport{Endpoint: "http://" + p.addr + "/mcp"}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		return s
	}
	list, err := session(replicas[0]).ListTools(ctx, nil)
	if err != nil || len(list.Tools) != 2 || list.Tools[0].Name != "nickname" || list.Tools[0].Description != "The nickname of a city." {
		t.Fatalf("tools/list: %+v %v", list, err)
	}
	s2 := session(replicas[1])
	res, err := s2.CallTool(ctx, &mcp.CallToolParams{Name: "nickname", Arguments: map[string]any{"city": "Seattle"}})
	if err != nil || res.IsError || res.Content[0].(*mcp.TextContent).Text != "The Emerald City" {
		t.Fatalf("tools/call nickname: %+v %v", res, err)
	}
	start := time.Now()
	res, err = s2.CallTool(ctx, &mcp.CallToolParams{Name: "wait", Arguments: map[string]any{}})
	if err != nil || !res.IsError || !strings.Contains(res.Content[0].(*mcp.TextContent).Text, "timed out") {
		t.Fatalf("tools/call wait: %+v %v; want a timeout after TOOLRELAY_MCP_CALL_TIMEOUT", res, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("a call capped at 1s took %s", took)
	}

	r, err := w.client.Responses.New(context.Background(), responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("What is the nickname of Seattle?")},
		Tools: []responses.ToolUnionParam{{OfMcp: &responses.ToolMcpParam{ServerLabel: "fleet",
			ServerURL:       openai.String(fmt.Sprintf("http://%s/mcp", replicas[0].addr)),
			RequireApproval: responses.ToolMcpRequireApprovalUnionParam{OfMcpToolApprovalSetting: openai.String("never")}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if got := r.OutputText(); got != "It is The Emerald City." {
		t.Errorf("the platform's answer through /mcp: %q", got)
	}
}
