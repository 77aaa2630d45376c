package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The bad-input corpus: malformed, oversized, truncated, deeply nested,
// wrongly typed and hostile inputs thrown at the running deployment, on
// every door it has. Each must get a clear refusal (a 4xx, a JSON-RPC
// error, a failed call, a refused declaration, a non-zero exit naming the
// problem) and nothing may crash; the turns running meanwhile are judged
// with the rest.

// corpusResult is one input and what it got.
type corpusResult struct {
	door, input, got string
	ok               bool
}

func nested(depth int) string {
	return strings.Repeat(`{"a":`, depth) + "1" + strings.Repeat("}", depth)
}

func (f *fleet) throwCorpus(ctx context.Context, b binaries) []corpusResult {
	var out []corpusResult
	add := func(door, input, got string, ok bool) {
		out = append(out, corpusResult{door: door, input: input, got: got, ok: ok})
	}
	live := f.liveDispatchers()
	if len(live) == 0 {
		return []corpusResult{{door: "any", input: "-", got: "no dispatcher running", ok: false}}
	}
	base := "http://" + live[0]
	post := func(path, body string, header http.Header) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, strings.NewReader(body))
		for k, v := range header {
			req.Header[k] = v
		}
		if req.Header.Get("Content-Type") == "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 300))
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	refusal := func(code int) bool { return code >= 400 && code < 500 }

	// POST /v1/watch
	big := `{"platform":"responses","response_id":"` + strings.Repeat("r", 4<<20) + `"}`
	for name, body := range map[string]string{
		"empty": "", "truncated": `{"platform":"respon`, "array": `[]`, "null": `null`,
		"unknown platform": `{"platform":"gemini","response_id":"x"}`, "wrong type": `{"platform":1}`,
		"missing id": `{"platform":"responses"}`, "subject tokens in an id": `{"platform":"responses","response_id":"resp_a.>"}`,
		"unknown field": `{"platform":"responses","response_id":"resp_x","drop":"table"}`,
		"deeply nested": nested(10000), "4 MiB id": big, "not UTF-8": "{\"platform\":\"\xff\xfe\"}",
		"unknown object": `{"platform":"assistants","thread_id":"thread_nope","run_id":"run_nope"}`,
	} {
		code, msg := post("/v1/watch", body, nil)
		add("POST /v1/watch", name, fmt.Sprintf("%d %s", code, short(msg)), refusal(code))
	}
	// POST /webhooks/openai
	now := fmt.Sprint(time.Now().Unix())
	for name, h := range map[string]http.Header{
		"unsigned":      {},
		"bad signature": {"Webhook-Id": {"wh_x"}, "Webhook-Timestamp": {now}, "Webhook-Signature": {"v1,AAAA"}},
		"stale":         {"Webhook-Id": {"wh_y"}, "Webhook-Timestamp": {"1000000000"}, "Webhook-Signature": {"v1,AAAA"}},
	} {
		code, msg := post("/webhooks/openai", `{"type":"agent.session.action_required","data":{"id":"as_x"}}`, h)
		add("POST /webhooks/openai", name, fmt.Sprintf("%d %s", code, short(msg)), code == http.StatusUnauthorized)
	}
	code, msg := post("/webhooks/openai", strings.Repeat("x", 8<<20), nil)
	add("POST /webhooks/openai", "8 MiB unsigned", fmt.Sprintf("%d %s", code, short(msg)), refusal(code))

	// /mcp, raw JSON-RPC
	mh := http.Header{"Accept": {"application/json, text/event-stream"}, "Mcp-Protocol-Version": {"2025-11-25"}}
	for name, body := range map[string]string{
		"not JSON": `{{{`, "wrong version": `{"jsonrpc":"1.0","id":1,"method":"tools/list"}`,
		"unknown method":  `{"jsonrpc":"2.0","id":1,"method":"tools/drop"}`,
		"unknown tool":    `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_ghost","arguments":{}}}`,
		"subject tokens":  `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"fn.>","arguments":{}}}`,
		"args not object": `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"lookup","arguments":"x"}}`,
		"deeply nested":   nested(10000),
	} {
		code, msg := post("/mcp", body, mh)
		ok := refusal(code) || code == http.StatusOK && (strings.Contains(msg, `"error"`) || strings.Contains(msg, `"isError":true`))
		add("POST /mcp", name, fmt.Sprintf("%d %s", code, short(msg)), ok)
	}
	out = append(out, f.mcpCorpus(ctx, base)...)
	out = append(out, f.natsCorpus(ctx)...)
	out = append(out, f.fileCorpus(ctx, b)...)
	return out
}

// mcpCorpus calls through the official MCP client: arguments that break
// the schema, and huge ones, are failed calls that never run.
func (f *fleet) mcpCorpus(ctx context.Context, base string) []corpusResult {
	var out []corpusResult
	s, err := mcp.NewClient(&mcp.Implementation{Name: "chaos", Version: "1"}, nil).
		Connect(ctx, &mcp.StreamableClientTransport{Endpoint: base + "/mcp"}, nil)
	if err != nil {
		return []corpusResult{{door: "MCP client", input: "connect", got: err.Error()}}
	}
	defer s.Close()
	for name, args := range map[string]any{
		"schema violation": map[string]any{"order": 7},
		"2 MiB argument":   map[string]any{"order": strings.Repeat("o", 2<<20)},
	} {
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		res, err := s.CallTool(cctx, &mcp.CallToolParams{Name: "lookup", Arguments: args})
		cancel()
		switch {
		case err != nil:
			out = append(out, corpusResult{door: "MCP tools/call lookup", input: name, got: short(err.Error()), ok: true})
		case res.IsError:
			text := ""
			if len(res.Content) > 0 {
				if t, ok := res.Content[0].(*mcp.TextContent); ok {
					text = t.Text
				}
			}
			out = append(out, corpusResult{door: "MCP tools/call lookup", input: name, got: "isError: " + short(text), ok: true})
		default:
			out = append(out, corpusResult{door: "MCP tools/call lookup", input: name, got: "succeeded", ok: false})
		}
	}
	return out
}

// natsCorpus publishes, as team orders, malformed envelopes on its own
// subjects and malformed declarations.
func (f *fleet) natsCorpus(ctx context.Context) []corpusResult {
	var out []corpusResult
	auth, err := f.auth("orders")
	if err != nil {
		return []corpusResult{{door: "NATS as orders", input: "connect", got: err.Error()}}
	}
	nc, err := nats.Connect(f.natsURL, auth)
	if err != nil {
		return []corpusResult{{door: "NATS as orders", input: "connect", got: err.Error()}}
	}
	defer nc.Close()
	req := func(door, name, subject string, data []byte) {
		m, err := nc.RequestWithContext(ctx, subject, data)
		got := ""
		if err != nil {
			got = err.Error()
		} else {
			got = short(string(m.Data))
		}
		// A JetStream answer that stored it, or refused it: the dispatcher
		// and executors must then cope (checked by the invariants).
		out = append(out, corpusResult{door: door, input: name, got: got, ok: true})
	}
	key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_corpus", []string{"call_1"}).Call("call_1")
	req("NATS fnresult.orders", "not JSON", protocol.ResultSubject("orders", key), []byte("{{{"))
	req("NATS fnresult.orders", "a result of another subject", protocol.ResultSubject("orders", key),
		[]byte(`{"v":1,"key":"00000000000000000000000000000000.0000000000000000","call_id":"c","team":"billing","function":"quote","finished_at":"2026-01-01T00:00:00Z"}`))
	req("NATS fncall.orders", "garbage call", protocol.CallSubject("orders", "lookup"), []byte("garbage"))
	req("NATS fncall.orders", "call of an unknown function", protocol.CallSubject("orders", "nope"), []byte("{}"))
	for name, body := range map[string]string{
		"not JSON": "{{{", "no declarations": `{"v":1,"op":"declare","declarations":[]}`,
		"another team's": `{"v":1,"op":"declare","declarations":[{"v":1,"instance":"x","started_at":"2026-01-01T00:00:00Z","spec":{"v":1,"name":"quote","team":"billing","parameters":{"type":"object"},"updated_at":"2026-01-01T00:00:00Z"}}]}`,
		"bad name":       `{"v":1,"op":"declare","declarations":[{"v":1,"instance":"x","started_at":"2026-01-01T00:00:00Z","spec":{"v":1,"name":"a.b","team":"orders","parameters":{"type":"object"},"updated_at":"2026-01-01T00:00:00Z"}}]}`,
	} {
		m, err := nc.RequestWithContext(ctx, protocol.DeclareSubject("orders"), []byte(body))
		got, ok := "", false
		if err != nil {
			got = err.Error()
		} else {
			var reply protocol.DeclareReply
			_ = json.Unmarshal(m.Data, &reply)
			got, ok = short(reply.Error), reply.Error != "" && len(reply.Accepted) == 0
		}
		out = append(out, corpusResult{door: "NATS toolrelay.declare.orders", input: name, got: got, ok: ok})
	}
	return out
}

// fileCorpus starts the executor on broken functions files: each must exit
// non-zero at once, naming the problem, and start nothing.
func (f *fleet) fileCorpus(ctx context.Context, b binaries) []corpusResult {
	var out []corpusResult
	for name, body := range map[string]string{
		"unknown key":            "functions:\n  - name: a\n    owner: orders\n    colour: red\n    command: [\"true\"]\n",
		"subject tokens":         "functions:\n  - name: a.>\n    owner: orders\n    command: [\"true\"]\n",
		"bad schema":             "functions:\n  - name: a\n    owner: orders\n    parameters: {type: 7}\n    command: [\"true\"]\n",
		"duplicate":              "functions:\n  - name: a\n    owner: orders\n    command: [\"true\"]\n  - name: a\n    owner: orders\n    command: [\"true\"]\n",
		"two kinds":              "functions:\n  - name: a\n    owner: orders\n    command: [\"true\"]\n    http: {url: \"http://x\"}\n",
		"not YAML":               "functions: [\n",
		"timeout not a duration": "functions:\n  - name: a\n    owner: orders\n    timeout: soon\n    command: [\"true\"]\n",
	} {
		path := filepath.Join(f.dir, "bad.yaml")
		_ = os.WriteFile(path, []byte(body), 0o644)
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		cmd := osexec.CommandContext(cctx, b.executor, "-config", path)
		cmd.Env = append(os.Environ(), "NATS_URL=nats://127.0.0.1:1") // never reached: the file is refused first
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		err := cmd.Run()
		cancel()
		msg := strings.TrimSpace(stderr.String())
		ok := err != nil && cmd.ProcessState != nil && cmd.ProcessState.ExitCode() > 0 && strings.Contains(msg, "bad.yaml")
		out = append(out, corpusResult{door: "executor -config", input: name, got: short(lastLine(msg)), ok: ok})
	}
	return out
}

func lastLine(s string) string {
	if i := strings.LastIndex(s, "\n"); i >= 0 {
		return s[i+1:]
	}
	return s
}

func short(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}
