package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
)

// conversation is one object the soak started on the platform and asked a
// dispatcher to drive.
type conversation struct {
	platform string
	ref      map[string]string // the watch request's body
	tight    bool              // an Assistants run expiring 30 s after creation
	hookOnly bool              // an Agents session left to the platform's webhooks
	started  time.Time
	watchErr error
}

// load starts conversations on the platform, as users would, and hands
// each to a dispatcher with POST /v1/watch.
type load struct {
	f      *fleet
	rng    *rand.Rand
	client openai.Client

	mu    sync.Mutex
	convs []*conversation
	wg    sync.WaitGroup
	// mcp counts tools/call outcomes on /mcp: ok, failed (isError or a
	// transport error, as when the dispatcher holding the request dies),
	// and wrong (a success with the wrong output: a violation).
	mcpOK, mcpFailed, mcpWrong int
	mcpErrors                  []string // the first few failures, for the report
}

func newLoad(f *fleet, rng *rand.Rand) *load {
	return &load{f: f, rng: rng, client: openai.NewClient(option.WithBaseURL(f.simURL), option.WithAPIKey(simAPIKey),
		option.WithHeader("X-Chaos-Driver", "1"), option.WithMaxRetries(5))}
}

// run starts rate conversations a second until ctx ends, then waits for
// the ones being started.
func (l *load) run(ctx context.Context, rate float64) {
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			l.wg.Wait()
			return
		case <-tick.C:
		}
		prompt := prompts[l.rng.IntN(len(prompts))]
		platform := []string{"agents", "assistants", "responses", "mcp"}[l.rng.IntN(4)]
		tight := (platform == "assistants" || platform == "agents") && l.rng.IntN(2) == 0
		pick := l.rng.Uint64()
		l.wg.Go(func() { l.start(context.WithoutCancel(ctx), platform, prompt, tight, pick) })
	}
}

// start creates the conversation; tight is, for Assistants, a run that
// expires 30 s after creation and, for Agents, a session left to webhooks
// (no watch request).
func (l *load) start(ctx context.Context, platform, prompt string, tight bool, pick uint64) {
	if platform == "mcp" {
		l.mcpCall(ctx, pick)
		return
	}
	c := &conversation{platform: platform, tight: tight && platform == "assistants", hookOnly: tight && platform == "agents", started: time.Now()}
	switch platform {
	case "agents":
		s, err := l.client.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
			Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
			Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String(prompt)},
		})
		if err != nil {
			c.watchErr = fmt.Errorf("create session: %w", err)
			break
		}
		c.ref = map[string]string{"platform": "agents", "session_id": s.ID}
	case "assistants":
		var md map[string]string
		if tight {
			md = map[string]string{platformsim.SimTTLMetadataKey: "30s"}
		}
		r, err := platformsim.StartAssistantsRun(ctx, l.client, prompt, md)
		if err != nil {
			c.watchErr = err
			break
		}
		c.ref = map[string]string{"platform": "assistants", "thread_id": r.ThreadID, "run_id": r.ID}
	case "responses":
		r, err := l.client.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt-5.5",
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}})
		if err != nil {
			c.watchErr = fmt.Errorf("create response: %w", err)
			break
		}
		c.ref = map[string]string{"platform": "responses", "response_id": r.ID}
	}
	if c.ref != nil && !c.hookOnly {
		c.watchErr = l.watch(ctx, c.ref, pick)
	}
	l.mu.Lock()
	l.convs = append(l.convs, c)
	l.mu.Unlock()
}

// watch asks a running dispatcher to drive ref, trying the others (and
// again) until one accepts or a minute has passed: a dispatcher may be
// restarting.
func (l *load) watch(ctx context.Context, ref map[string]string, pick uint64) error {
	body, _ := json.Marshal(ref)
	deadline := time.Now().Add(time.Minute)
	var last error
	for i := uint64(0); time.Now().Before(deadline); i++ {
		live := l.f.liveDispatchers()
		if len(live) == 0 {
			last = fmt.Errorf("no dispatcher running")
		} else {
			addr := live[(pick+i)%uint64(len(live))]
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			req, _ := http.NewRequestWithContext(rctx, http.MethodPost, "http://"+addr+"/v1/watch", bytes.NewReader(body))
			req.Header.Set("Content-Type", "application/json") // a loopback caller's POST must be JSON
			resp, err := http.DefaultClient.Do(req)
			cancel()
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusAccepted {
					return nil
				}
				err = fmt.Errorf("POST /v1/watch on %s: %s", addr, resp.Status)
			}
			last = err
		}
		time.Sleep(250 * time.Millisecond) // between attempts; each attempt is bounded above
	}
	return last
}

// mcpCall calls lookup through a running dispatcher's /mcp with the
// official MCP client, as an agent client would.
func (l *load) mcpCall(ctx context.Context, pick uint64) {
	live := l.f.liveDispatchers()
	if len(live) == 0 {
		l.note(false, false)
		return
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	s, err := mcp.NewClient(&mcp.Implementation{Name: "chaos", Version: "1"}, nil).
		Connect(cctx, &mcp.StreamableClientTransport{Endpoint: "http://" + live[pick%uint64(len(live))] + "/mcp"}, nil)
	if err != nil {
		l.noteErr("connect: " + err.Error())
		return
	}
	defer s.Close()
	res, err := s.CallTool(cctx, &mcp.CallToolParams{Name: "lookup", Arguments: map[string]any{"order": "M-1"}})
	if err != nil {
		l.noteErr(err.Error())
		return
	}
	if res.IsError {
		msg := "isError"
		if len(res.Content) > 0 {
			if t, ok := res.Content[0].(*mcp.TextContent); ok {
				msg += ": " + t.Text
			}
		}
		l.noteErr(msg)
		return
	}
	text := ""
	if len(res.Content) > 0 {
		if t, ok := res.Content[0].(*mcp.TextContent); ok {
			text = t.Text
		}
	}
	l.note(true, strings.TrimSpace(text) != "found")
}

func (l *load) noteErr(msg string) {
	l.note(false, false)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.mcpErrors) < 5 {
		l.mcpErrors = append(l.mcpErrors, short(msg))
	}
}

func (l *load) note(ok, wrong bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case wrong:
		l.mcpWrong++
	case ok:
		l.mcpOK++
	default:
		l.mcpFailed++
	}
}

func (l *load) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.convs)
}

func (l *load) conversations() []*conversation {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]*conversation(nil), l.convs...)
}
