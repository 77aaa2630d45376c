package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// PlayResult is how one scenario went, as POST /dev/play answers it.
type PlayResult struct {
	Scenario string `json:"scenario"`
	Platform string `json:"platform"`
	Answer   string `json:"answer,omitempty"`
	Error    string `json:"error,omitempty"`
	// Calls are the calls of every turn, in order.
	Calls []PlayedCall `json:"calls"`
	// Traces are the trace IDs of the turns.
	Traces []string `json:"traces"`
}

// PlayedCall is one call of a played scenario.
type PlayedCall struct {
	Turn     int    `json:"turn"`
	Function string `json:"function"`
	// Result is ok, error, pending or timed_out.
	Result   string              `json:"result"`
	Output   string              `json:"output,omitempty"`
	Error    *protocol.CallError `json:"error,omitempty"`
	Duration string              `json:"duration,omitempty"`
}

// devPlayer plays scenarios through the simulator and the dispatcher, one
// at a time, and prints them.
type devPlayer struct {
	out       *lockedWriter
	client    openai.Client
	d         *dispatch.Dispatcher
	js        jetstream.JetStream
	rec       *tracetest.SpanRecorder
	apiURL    string
	timeout   time.Duration
	scenarios atomic.Pointer[[]platformsim.Scenario]
}

// playRequest asks the loop to play a scenario (all when empty).
type playRequest struct {
	scenario string
	reply    chan []PlayResult
}

// playHandler serves POST /dev/play[?scenario=NAME]: the loop plays and
// the answer lists how each scenario went (404 for an unknown name).
func playHandler(ctx context.Context, plays chan<- playRequest) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := playRequest{scenario: r.URL.Query().Get("scenario"), reply: make(chan []PlayResult, 1)}
		select {
		case plays <- req:
		case <-ctx.Done():
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		case <-r.Context().Done():
			return
		}
		var res []PlayResult
		select {
		case res = <-req.reply:
		case <-ctx.Done():
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		status := http.StatusOK
		if res == nil {
			status = http.StatusNotFound
			res = []PlayResult{{Scenario: req.scenario, Error: errNoScenario.Error()}}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		enc := json.NewEncoder(w)
		enc.SetEscapeHTML(false)
		enc.SetIndent("", "  ")
		_ = enc.Encode(res)
	})
}

// playAll plays every scenario (or the one named) in order; nil means no
// scenario has that name.
func (p *devPlayer) playAll(ctx context.Context, name string) []PlayResult {
	var out []PlayResult
	for _, sc := range *p.scenarios.Load() {
		if name == "" || sc.Name == name {
			out = append(out, p.play(ctx, sc))
		}
	}
	return out
}

// waitServed waits until the dispatcher is ready and a live executor
// serves every function of teams.
func (p *devPlayer) waitServed(ctx context.Context, teams map[string][]exec.Function, derr <-chan error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		missing := ""
		if !p.d.Ready() {
			missing = "the dispatcher"
		} else if specs, err := dispatch.Functions(ctx, p.js); err != nil {
			missing = "the registry"
		} else {
			served := map[string]bool{}
			for _, s := range specs {
				served[s.Team+"/"+s.Name] = true
			}
		find:
			for team, fns := range teams {
				for _, f := range fns {
					if !served[team+"/"+f.Name] {
						missing = f.Name
						break find
					}
				}
			}
		}
		if missing == "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("dev: %s is not ready after 30s", missing)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-derr:
			return fmt.Errorf("dev: the dispatcher stopped: %w", err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// play runs one scenario as an application would: it starts the
// conversation on the simulator with the tool definitions the registry
// gives for the platform, asks the dispatcher to drive it, and prints the
// answer, each call with its result, and each turn's trace.
func (p *devPlayer) play(ctx context.Context, sc platformsim.Scenario) PlayResult {
	platform := protocol.Platform(sc.Platform)
	if platform == "" {
		platform = protocol.PlatformResponses
	}
	res := PlayResult{Scenario: sc.Name, Platform: string(platform), Calls: []PlayedCall{}, Traces: []string{}}
	fail := func(err error) PlayResult {
		res.Error = err.Error()
		p.out.printf("  failed: %v\n\n", err)
		return res
	}
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	p.out.printf("[%s] %s\n  user: %s\n", platform, sc.Name, sc.Prompt)
	ref, err := p.start(ctx, platform, sc.Prompt)
	if err != nil {
		return fail(err)
	}
	started, err := p.d.Watch(ctx, ref)
	if err != nil {
		return fail(err)
	}
	// Only the ID of what Watch returns is read: its driver goes on
	// changing that record. WatchStatus returns a copy.
	id := started.ID
	var w *dispatch.Watch
	for {
		if w, err = p.d.WatchStatus(ctx, id); err != nil {
			return fail(err)
		}
		if w.State != dispatch.WatchActive {
			break
		}
		select {
		case <-ctx.Done():
			return fail(fmt.Errorf("no answer within %s", p.timeout))
		case <-time.After(10 * time.Millisecond):
		}
	}
	calls, err := p.calls(ctx, w.ID)
	if err != nil {
		return fail(err)
	}
	res.Calls = calls
	for _, c := range calls {
		line := fmt.Sprintf("  turn %d  %-28s %-9s %8s  ", c.Turn, c.Function, c.Result, c.Duration)
		if c.Error != nil {
			line += string(c.Error.Code) + ": " + c.Error.Message
		} else {
			line += oneLine(c.Output, 100)
		}
		p.out.printf("%s\n", line)
	}
	for i, key := range w.Turns {
		if spans := traceOf(p.rec, key, time.Second); spans != nil {
			res.Traces = append(res.Traces, spans[0].SpanContext().TraceID().String())
			p.out.printf("  turn %d, %s\n", i+1, strings.Repeat("-", 40))
			printTree(p.out, spans, "  ")
		}
	}
	if w.State == dispatch.WatchFailed {
		return fail(errors.New(w.Error))
	}
	res.Answer = w.Answer
	p.out.printf("  answer: %s\n\n", w.Answer)
	return res
}

// start creates the conversation on the platform with the tools the
// registry defines for it.
func (p *devPlayer) start(ctx context.Context, platform protocol.Platform, prompt string) (dispatch.Ref, error) {
	specs, err := dispatch.Functions(ctx, p.js)
	if err != nil {
		return dispatch.Ref{}, err
	}
	tools, err := tooldef.Definitions(specs, platform)
	if err != nil {
		return dispatch.Ref{}, err
	}
	switch platform {
	case protocol.PlatformAgents:
		s, err := p.client.Beta.Agents.Sessions.New(ctx, openai.BetaAgentSessionNewParams{
			Environment: openai.EnvironmentParamUnion{OfParamNone: &openai.EnvironmentParamNone{}},
			Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5")},
			Input:       openai.BetaAgentSessionNewParamsInputUnion{OfString: openai.String(prompt)},
		}, option.WithJSONSet("agent.tools", tools))
		if err != nil {
			return dispatch.Ref{}, fmt.Errorf("create session: %w", err)
		}
		return dispatch.Ref{Platform: platform, SessionID: s.ID}, nil
	case protocol.PlatformAssistants:
		a, err := p.client.Beta.Assistants.New(ctx, openai.BetaAssistantNewParams{Model: "gpt-4o"}, option.WithJSONSet("tools", tools))
		if err != nil {
			return dispatch.Ref{}, fmt.Errorf("create assistant: %w", err)
		}
		r, err := p.client.Beta.Threads.NewAndRun(ctx, openai.BetaThreadNewAndRunParams{
			AssistantID: a.ID,
			Thread: openai.BetaThreadNewAndRunParamsThread{Messages: []openai.BetaThreadNewAndRunParamsThreadMessage{{
				Role: "user", Content: openai.BetaThreadNewAndRunParamsThreadMessageContentUnion{OfString: openai.String(prompt)},
			}}},
		})
		if err != nil {
			return dispatch.Ref{}, fmt.Errorf("create run: %w", err)
		}
		return dispatch.Ref{Platform: platform, ThreadID: r.ThreadID, RunID: r.ID}, nil
	default:
		r, err := p.client.Responses.New(ctx, responses.ResponseNewParams{
			Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)},
		}, option.WithJSONSet("tools", tools))
		if err != nil {
			return dispatch.Ref{}, fmt.Errorf("create response: %w", err)
		}
		return dispatch.Ref{Platform: platform, ResponseID: r.ID}, nil
	}
}

// calls reads the watch's report from the dispatcher's own API, as a user
// would (GET /v1/watch/{id}), and lists its calls.
func (p *devPlayer) calls(ctx context.Context, id string) ([]PlayedCall, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.apiURL+"/v1/watch/"+id, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("read the watch: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("read the watch: %s", resp.Status)
	}
	var report struct {
		TurnDetails []struct {
			Calls []struct {
				Function      string              `json:"function"`
				Result        string              `json:"result"`
				Error         *protocol.CallError `json:"error"`
				Output        *string             `json:"output"`
				OutputPreview string              `json:"output_preview"`
				Duration      string              `json:"duration"`
			} `json:"calls"`
		} `json:"turn_details"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&report); err != nil {
		return nil, fmt.Errorf("read the watch: %w", err)
	}
	out := []PlayedCall{}
	for i, t := range report.TurnDetails {
		for _, c := range t.Calls {
			pc := PlayedCall{Turn: i + 1, Function: c.Function, Result: c.Result, Error: c.Error, Duration: c.Duration, Output: c.OutputPreview}
			if c.Output != nil {
				pc.Output = *c.Output
			}
			out = append(out, pc)
		}
	}
	return out, nil
}

// oneLine shortens s to one line of at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
