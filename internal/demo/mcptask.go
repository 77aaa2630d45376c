package demo

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// The demo's last scenario: an MCP client of protocol 2026-07-28 runs a
// function that takes longer than it waits for an answer, as a task of
// the Tasks extension (io.modelcontextprotocol/tasks). The call reaches
// a second dispatcher replica, which answers with the task once it is
// recorded in JetStream; the client lets go and that replica stops; the
// client then reads the result from the first replica.

const (
	// reportTakes is how long build_report runs.
	reportTakes = 2500 * time.Millisecond
	// clientPatience is how long the scenario's client waits for any one
	// answer: less than the call takes.
	clientPatience = 2 * time.Second
	// taskPollAtLeast is how often, at the most, the client polls,
	// whatever pollIntervalMs the task suggests.
	taskPollAtLeast = 200 * time.Millisecond
)

// reportFunction takes reportTakes to build a quarter's report.
func reportFunction() exec.Function {
	return exec.Function{
		Name:        "build_report",
		Description: "Build a quarter's sales report. Takes a while.",
		Parameters:  schema(`{"quarter":{"type":"string","description":"The quarter, e.g. 2026-Q3"}}`, "quarter"),
		Timeout:     time.Minute,
		Handler: typed(func(ctx context.Context, a struct {
			Quarter string `json:"quarter"`
		}) (any, error) {
			select {
			case <-time.After(reportTakes):
				return map[string]any{"quarter": a.Quarter, "orders": 1284, "revenue": "412,300 USD"}, nil
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}),
	}
}

// taskReplica is the second dispatcher of the scenario, serving its HTTP
// API, and the executor serving build_report.
type taskReplica struct {
	url  string // its /mcp
	stop func() // stops the replica (not the executor)
}

// startTaskReplica starts a second dispatcher replica on natsURL (its
// platforms reached with client) with its own HTTP API, and an executor
// of build_report, and waits until the function is served. Both stop
// when ctx ends.
func startTaskReplica(ctx context.Context, wg *sync.WaitGroup, natsURL string, client openai.Client, out *lockedWriter, tp *sdktrace.TracerProvider,
	opts Options) (*taskReplica, error) {
	enc, ejs, err := connect(natsURL, "toolrelay-demo-report-executor")
	if err != nil {
		return nil, err
	}
	ex, err := exec.New(ejs, Team, exec.Options{Logger: opts.Logger, Middleware: []exec.Middleware{announce(out)}, TracerProvider: tp})
	if err == nil {
		err = ex.Register(reportFunction())
	}
	if err != nil {
		enc.Close()
		return nil, err
	}
	wg.Go(func() { _ = ex.Run(ctx); enc.Close() })

	nc, js, err := connect(natsURL, "toolrelay-demo-dispatcher-2")
	if err != nil {
		return nil, err
	}
	d, err := dispatch.New(js, openaiplatform.New(client), dispatch.Options{Name: "replica-2", Logger: opts.Logger, TracerProvider: tp})
	if err != nil {
		nc.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	ran := make(chan error, 1)
	wg.Go(func() { ran <- d.Run(rctx); nc.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		cancel()
		return nil, fmt.Errorf("demo: listen for the second replica's HTTP API: %w", err)
	}
	api := httpapi.NewServer(httpapi.New(d, httpapi.Options{Logger: opts.Logger, TracerProvider: tp}), httpapi.Timeouts{})
	go func() { _ = api.Serve(ln) }()
	var once sync.Once
	r := &taskReplica{url: "http://" + ln.Addr().String() + "/mcp", stop: func() {
		once.Do(func() { _ = api.Close(); cancel(); <-ran })
	}}
	if err := waitServed(ctx, d, js, "build_report"); err != nil {
		r.stop()
		return nil, err
	}
	return r, nil
}

// waitServed waits until d is ready and a live executor serves fn.
func waitServed(ctx context.Context, d *dispatch.Dispatcher, js jetstream.JetStream, fn string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		if specs, err := dispatch.Functions(ctx, js); err == nil && d.Ready() {
			for _, s := range specs {
				if s.Name == fn {
					return nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: %s was not served within 30s", fn)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// taskClient is an MCP client of protocol 2026-07-28 declaring the Tasks
// extension on each request, as raw JSON-RPC over HTTP, so the demo shows
// what goes over the wire.
type taskClient struct {
	http *http.Client
}

// call sends method with params to url and decodes its result into res.
func (c *taskClient) call(ctx context.Context, url, method string, params map[string]any, res any) error {
	params["_meta"] = map[string]any{
		"io.modelcontextprotocol/protocolVersion": "2026-07-28",
		"io.modelcontextprotocol/clientInfo":      map[string]any{"name": "toolrelay-demo", "version": "1"},
		"io.modelcontextprotocol/clientCapabilities": map[string]any{
			"extensions": map[string]any{"io.modelcontextprotocol/tasks": map[string]any{}}},
	}
	body, err := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": method, "params": params})
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", method)
	for _, k := range []string{"name", "taskId"} {
		if v, ok := params[k].(string); ok {
			req.Header.Set("Mcp-Name", v)
		}
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if i := bytes.LastIndex(b, []byte("data: ")); strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") && i >= 0 {
		b = bytes.TrimSpace(b[i+len("data: "):])
	}
	var answer struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &answer); err != nil {
		return fmt.Errorf("%s: HTTP %d %q: %w", method, resp.StatusCode, b, err)
	}
	if answer.Error != nil {
		return fmt.Errorf("%s: JSON-RPC error %d: %s", method, answer.Error.Code, answer.Error.Message)
	}
	return json.Unmarshal(answer.Result, res)
}

// extTask is what the scenario reads of a task.
type extTask struct {
	ResultType     string `json:"resultType"`
	TaskID         string `json:"taskId"`
	Status         string `json:"status"`
	TTLMs          int64  `json:"ttlMs"`
	PollIntervalMs int64  `json:"pollIntervalMs"`
	Result         *struct {
		Content []struct {
			Text string `json:"text"`
		} `json:"content"`
		IsError bool `json:"isError"`
	} `json:"result"`
}

// playMCPTask plays the scenario: the task is created on replica 2
// (url2), which then stops, and its result is read from replica 1 (url1).
func playMCPTask(ctx context.Context, out *lockedWriter, url1 string, r2 *taskReplica, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out.printf("[mcp task] An MCP client (2026-07-28, extension io.modelcontextprotocol/tasks) runs a call longer than it waits, across two replicas\n")
	out.printf("  client -> replica 2: tools/call build_report {\"quarter\":\"2026-Q3\"} (it takes %s; the client waits %s at most)\n", reportTakes, clientPatience)
	c := &taskClient{http: &http.Client{Timeout: clientPatience}}
	var task extTask
	if err := c.call(ctx, r2.url, "tools/call", map[string]any{"name": "build_report", "arguments": map[string]any{"quarter": "2026-Q3"}}, &task); err != nil {
		return err
	}
	if task.ResultType != "task" || task.TaskID == "" {
		return fmt.Errorf("tools/call answered %+v; want a task", task)
	}
	out.printf("  replica 2: resultType task, %s %s (ttlMs %d, pollIntervalMs %d)\n", task.TaskID, task.Status, task.TTLMs, task.PollIntervalMs)
	c.http.CloseIdleConnections()
	r2.stop()
	out.printf("  the client disconnects; replica 2 stops\n")

	poll := max(time.Duration(task.PollIntervalMs)*time.Millisecond, taskPollAtLeast)
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("task %s did not end within %s", task.TaskID, timeout)
		case <-time.After(poll):
		}
		var got extTask
		if err := c.call(ctx, url1, "tasks/get", map[string]any{"taskId": task.TaskID}, &got); err != nil {
			return err
		}
		if got.Status == "working" {
			out.printf("  client -> replica 1: tasks/get -> working\n")
			continue
		}
		if got.Status != "completed" || got.Result == nil || len(got.Result.Content) == 0 || got.Result.IsError {
			return fmt.Errorf("task %s ended %s: %+v", task.TaskID, got.Status, got.Result)
		}
		out.printf("  client -> replica 1: tasks/get -> completed: %s\n\n", got.Result.Content[0].Text)
		return nil
	}
}
