package platformsim_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// ordersFunctions stand in for the functions of testdata/dev-functions.yaml.
func ordersFunction(name string, args map[string]any) string {
	switch name {
	case "get_order_status":
		if args["order_id"] == "A-1002" {
			return `{"status":"packing","carrier":"dhl"}`
		}
		return `{"status":"shipped","carrier":"ups"}`
	case "get_shipping_eta":
		return `{"eta":"2026-12-03"}`
	case "issue_refund":
		return "refund of 500 cents issued"
	}
	return "unknown function " + name
}

func loadExample(t *testing.T) []platformsim.Scenario {
	t.Helper()
	sc, err := platformsim.LoadScenarios("../../testdata/scenarios.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// playResponses answers each response's function calls with f until the
// model answers, and returns the answer and every step's calls as
// "name arguments".
func playResponses(t *testing.T, c openai.Client, prompt string) (string, [][]string) {
	t.Helper()
	ctx := t.Context()
	r, err := c.Responses.New(ctx, responses.ResponseNewParams{
		Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)},
	})
	var steps [][]string
	for range 10 {
		if err != nil {
			t.Fatal(err)
		}
		var outs responses.ResponseInputParam
		var step []string
		for _, it := range r.Output {
			if it.Type != "function_call" {
				continue
			}
			fc := it.AsFunctionCall()
			step = append(step, fc.Name+" "+fc.Arguments)
			var args map[string]any
			if err := json.Unmarshal([]byte(fc.Arguments), &args); err != nil {
				t.Fatalf("%s: arguments are not a JSON object: %s", fc.Name, fc.Arguments)
			}
			o := responses.ResponseInputItemParamOfFunctionCallOutput(ordersFunction(fc.Name, args))
			o.OfFunctionCallOutput.CallID = openai.String(fc.CallID)
			outs = append(outs, o)
		}
		if len(outs) == 0 {
			return r.OutputText(), steps
		}
		steps = append(steps, step)
		r, err = c.Responses.New(ctx, responses.ResponseNewParams{
			Model: "gpt-5.5", PreviousResponseID: openai.String(r.ID),
			Input: responses.ResponseNewParamsInputUnion{OfInputItemList: outs},
		})
	}
	t.Fatal("no answer after 10 steps")
	return "", nil
}

// The example file, played through the official SDK: steps in sequence,
// an argument built from an earlier output, non-string arguments from a
// string template, and the answers built from the outputs.
func TestScenariosFileResponses(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: loadExample(t)}})
	c := client(hs)
	tests := []struct {
		prompt string
		steps  [][]string
		answer string
	}{
		{"Where is order A-1001?",
			[][]string{{`get_order_status {"order_id":"A-1001"}`}, {`get_shipping_eta {"order_id":"A-1001","carrier":"ups"}`}},
			"Order A-1001 is shipped with ups, arriving 2026-12-03."},
		{"Please refund 5 euros on A-1002 today",
			[][]string{{`get_order_status {"order_id":"A-1002"}`}, {`issue_refund {"order_id":"A-1002","amount_cents":500,"carrier":"dhl"}`}},
			"refund of 500 cents issued"},
		{"What is the weather?", nil, "I can only help with the scenarios this simulator was given."},
	}
	for _, tc := range tests {
		t.Run(tc.prompt, func(t *testing.T) {
			answer, steps := playResponses(t, c, tc.prompt)
			if diff := cmp.Diff(tc.steps, steps); diff != "" {
				t.Errorf("calls (-want +got):\n%s", diff)
			}
			if answer != tc.answer {
				t.Errorf("answer = %q, want %q", answer, tc.answer)
			}
		})
	}
}

// Calls of one step are asked for together: the SDK's Agents helper gets
// both before any result is sent, and "as" keeps their outputs apart.
func TestScenariosFileAgentsParallel(t *testing.T) {
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: loadExample(t)}})
	c := client(hs)
	sess, err := c.Beta.Agents.Sessions.New(t.Context(), openai.BetaAgentSessionNewParams{
		Environment: openai.EnvironmentParamOfParamSelfHosted("/work"),
		Agent:       openai.BetaAgentSessionNewParamsAgent{Model: openai.String("gpt-5.5")},
	})
	if err != nil {
		t.Fatal(err)
	}
	var pendingAtFirst int
	calls := 0
	handler := func(ctx context.Context, args map[string]any) (any, error) {
		if calls++; calls == 1 {
			// No result is sent yet: both calls of the step must be pending.
			s, err := c.Beta.Agents.Sessions.Get(ctx, sess.ID)
			if err != nil {
				return nil, err
			}
			pendingAtFirst = len(s.RequiredActions)
		}
		var out map[string]any
		err := json.Unmarshal([]byte(ordersFunction("get_order_status", args)), &out)
		return out, err
	}
	res, err := c.Beta.Agents.Sessions.Stream(t.Context(), sess.ID, openai.AgentSessionStreamParams{
		Input:        "compare orders a-1001 and a-1002",
		ToolHandlers: map[string]openai.AgentToolHandler{"get_order_status": handler},
	}).WithResultCollection().FinalResult()
	if err != nil {
		t.Fatal(err)
	}
	if pendingAtFirst != 2 || calls != 2 {
		t.Errorf("%d calls pending when the first ran, %d calls in all; want 2 and 2", pendingAtFirst, calls)
	}
	if got, want := res.OutputText(), "A-1001 is shipped; A-1002 is packing."; got != want {
		t.Errorf("answer = %q, want %q", got, want)
	}
}

func TestLoadScenariosErrorsNameFileAndField(t *testing.T) {
	const call = "    calls:\n      - function: f\n"
	tests := map[string]struct {
		body string
		want []string
	}{
		"unknown key":           {"scenarios:\n  - prompt: hi\n    colour: blue\n" + call, []string{"colour"}},
		"unknown call key":      {"scenarios:\n  - prompt: hi\n    calls:\n      - function: f\n        args: {}\n", []string{"args"}},
		"no prompt":             {"scenarios:\n  - name: a\n" + call, []string{"scenarios[0] (a)", "prompt"}},
		"bad function":          {"scenarios:\n  - prompt: hi\n    calls:\n      - function: a.b\n", []string{"calls[0].function", "a.b"}},
		"bad template":          {"scenarios:\n  - prompt: hi\n" + call + "    answer: '{{out \"f\"'\n", []string{"answer", "unclosed action"}},
		"unknown template func": {"scenarios:\n  - prompt: hi\n" + call + "    answer: '{{upper (out \"f\")}}'\n", []string{"answer", "upper"}},
		"output not made yet": {"scenarios:\n  - prompt: hi\n    steps:\n      - calls:\n          - function: f\n            arguments: {x: '{{out \"g\"}}'}\n",
			[]string{"steps[0].calls[0].arguments", `{{out "g"}}`, "no earlier step"}},
		"output of the same step": {"scenarios:\n  - prompt: hi\n    calls:\n      - function: f\n      - function: g\n        arguments: {x: '{{out \"f\"}}'}\n",
			[]string{"calls[1].arguments", "no earlier step"}},
		"answer uses unknown output": {"scenarios:\n  - prompt: hi\n" + call + "    answer: '{{out \"nope\"}}'\n", []string{"answer", `"nope"`, `available: "f"`}},
		"arguments not an object":    {"scenarios:\n  - prompt: hi\n    calls:\n      - function: f\n        arguments: '[1,2]'\n", []string{"calls[0].arguments", "JSON object"}},
		"arguments a list":           {"scenarios:\n  - prompt: hi\n    calls:\n      - function: f\n        arguments: [1, 2]\n", []string{"calls[0].arguments", "mapping"}},
		"control in a value":         {"scenarios:\n  - prompt: hi\n    calls:\n      - function: f\n        arguments: {x: '{{if true}}y{{end}}'}\n", []string{"calls[0].arguments", "only {{...}} actions"}},
		"same output twice":          {"scenarios:\n  - prompt: hi\n    calls:\n      - function: f\n      - function: f\n", []string{"calls[1].as", "as:"}},
		"calls and steps":            {"scenarios:\n  - prompt: hi\n" + call + "    steps:\n      - calls:\n          - function: f\n", []string{"not both"}},
		"empty step":                 {"scenarios:\n  - prompt: hi\n    steps:\n      - calls: []\n", []string{"steps[0].calls"}},
		"bad platform":               {"scenarios:\n  - prompt: hi\n    platform: slack\n" + call, []string{"platform", "slack"}},
		"shadowed prompt":            {"scenarios:\n  - prompt: order\n" + call + "  - prompt: my order status\n" + call, []string{"scenarios[1]", "scenarios[0]", "never play"}},
		"empty list":                 {"scenarios: []\n", []string{"empty"}},
		"empty file":                 {"", []string{"empty"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := testutil.WriteFile(t, "scenarios.yaml", tc.body)
			_, err := platformsim.LoadScenarios(path)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.HasPrefix(err.Error(), path+": ") {
				t.Errorf("error does not start with the file: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// A scenario without an answer answers with every output, in order.
func TestScenarioDefaultAnswer(t *testing.T) {
	body := "scenarios:\n  - prompt: status\n    steps:\n      - calls: [{function: get_order_status, arguments: {order_id: A-1}}]\n" +
		"      - calls: [{function: get_shipping_eta, arguments: {order_id: A-1, carrier: '{{field (out \"get_order_status\") \"carrier\"}}'}}]\n"
	sc, err := platformsim.LoadScenarios(testutil.WriteFile(t, "s.yaml", body))
	if err != nil {
		t.Fatal(err)
	}
	_, hs := newSim(t, platformsim.Options{Model: &platformsim.Model{Scenarios: sc}})
	answer, _ := playResponses(t, client(hs), "status")
	if want := "get_order_status: {\"status\":\"shipped\",\"carrier\":\"ups\"}\nget_shipping_eta: {\"eta\":\"2026-12-03\"}"; answer != want {
		t.Errorf("answer = %q, want %q", answer, want)
	}
}
