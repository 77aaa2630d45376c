package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The inspection commands (turns, turn, functions, watches) read a running
// dispatcher's HTTP API, as the console does; they never touch NATS.

// APITokenEnv names the variable the inspection commands read their
// bearer token from.
const APITokenEnv = "TOOLRELAY_API_TOKEN"

// defaultAPIAddr is where the CLI's commands look for the API, unless
// APIURLEnv or -addr says otherwise.
const defaultAPIAddr = "http://127.0.0.1:8080"

// APIURLEnv names the dispatcher's HTTP API for the CLI's commands (call,
// turns, turn, functions, watches): the default of their -addr.
const APIURLEnv = "TOOLRELAY_API_URL"

// apiAddr is the default of the CLI's -addr flags.
func apiAddr() string {
	if u := os.Getenv(APIURLEnv); u != "" {
		return u
	}
	return defaultAPIAddr
}

// apiBase is the base URL of the API at addr, given as a URL or as
// host:port (as dev's own -addr takes it).
func apiBase(addr string) string {
	base := strings.TrimRight(addr, "/")
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	return base
}

// apiRequestTimeout bounds one request of an inspection command.
const apiRequestTimeout = 30 * time.Second

// apiClient reads the dispatcher's HTTP API.
type apiClient struct {
	base  string
	token string
}

// get decodes the JSON body of GET path?query into v; an answer other
// than 200 is an error carrying the API's message.
func (c *apiClient) get(ctx context.Context, path string, query url.Values, v any) error {
	body, err := c.do(ctx, http.MethodGet, path, query, nil)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("GET %s: decode the answer: %w", path, err)
	}
	return nil
}

// do sends method path?query with body (JSON, if any) and returns the
// answer's body; an answer other than 200 is an error carrying the API's
// message.
func (c *apiClient) do(ctx context.Context, method, path string, query url.Values, body []byte) ([]byte, error) {
	u := apiBase(c.base) + path
	if len(query) > 0 {
		u += "?" + query.Encode()
	}
	ctx, cancel := context.WithTimeout(ctx, apiRequestTimeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, fmt.Errorf("-addr %s: %w", c.base, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w (is the dispatcher running there? see -addr)", method, path, err)
	}
	defer resp.Body.Close()
	answer, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		var e struct{ Error struct{ Message string } }
		msg := strings.TrimSpace(string(answer))
		if json.Unmarshal(answer, &e) == nil && e.Error.Message != "" {
			msg = e.Error.Message
		}
		hint := ""
		if resp.StatusCode == http.StatusUnauthorized && c.token == "" {
			hint = " (set " + APITokenEnv + ")"
		}
		return nil, fmt.Errorf("%s %s: %s: %s%s", method, path, resp.Status, msg, hint)
	}
	return answer, nil
}

// inspectFlags are the flags every inspection command has.
func inspectFlags(name, usage string, stderr io.Writer) (*flag.FlagSet, *apiClient, *bool) {
	fs := flag.NewFlagSet("dispatcher "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &apiClient{token: os.Getenv(APITokenEnv)}
	fs.StringVar(&c.base, "addr", apiAddr(), "the dispatcher's HTTP API, as a URL or host:port (default from "+APIURLEnv+")")
	asJSON := fs.Bool("json", false, "print the API's JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: dispatcher %s\n\n", usage)
		fs.PrintDefaults()
		fmt.Fprintf(stderr, "\nThe bearer token, when the dispatcher needs one, comes from %s.\n", APITokenEnv)
	}
	return fs, c, asJSON
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func turnsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c, asJSON := inspectFlags("turns", "turns [-open] [-team T] [-function F] [-platform P] [-outcome O] [-limit N] [-json] [-addr URL]", stderr)
	open := fs.Bool("open", false, "only open turns (leave out the recently closed)")
	team := fs.String("team", "", "only turns calling this team's functions")
	function := fs.String("function", "", "only turns calling this function")
	platform := fs.String("platform", "", "only turns of this platform: agents, assistants, responses or mcp (calls through /mcp and dispatcher call)")
	outcome := fs.String("outcome", "", "only turns with this outcome: open, submitted, cut_off or failed")
	limit := fs.Int("limit", 0, "at most this many turns per list (default: the API's, 500)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	q := url.Values{}
	for k, v := range map[string]string{"team": *team, "function": *function, "platform": *platform, "outcome": *outcome} {
		if v != "" {
			q.Set(k, v)
		}
	}
	if *open {
		q.Set("open", "1")
	}
	if *limit > 0 {
		q.Set("limit", strconv.Itoa(*limit))
	}
	var list dispatch.TurnList
	if err := c.get(ctx, "/v1/turns", q, &list); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, &list)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "OPEN (%d)\n", list.OpenTotal)
	if len(list.Open) > 0 {
		fmt.Fprintln(tw, "KEY\tPLATFORM\tOBJECT\tTEAMS\tFUNCTIONS\tSTATE\tDEADLINE\tLEFT")
	}
	for _, t := range list.Open {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Key, t.Platform, t.ObjectID, strings.Join(t.Teams, ","),
			strings.Join(t.Functions, ","), t.State, t.Deadline.Local().Format(time.TimeOnly), timeLeft(t.TimeLeftMS))
	}
	if len(list.Open) < list.OpenTotal {
		fmt.Fprintf(tw, "... and %d more (-limit)\n", list.OpenTotal-len(list.Open))
	}
	if !*open {
		fmt.Fprintf(tw, "\nRECENTLY CLOSED (%d, of the fleet's latest %d)\n", len(list.Recent), list.RecentKept)
		if len(list.Recent) > 0 {
			fmt.Fprintln(tw, "KEY\tPLATFORM\tOBJECT\tOUTCOME\tCALLS\tDURATION\tLEFT AT SUBMIT\tSUBMITTED\tTRACE")
		}
		for _, t := range list.Recent {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Key, t.Platform, t.ObjectID, t.Outcome, callsSummary(t.Calls),
				dash(t.Duration), dash(t.TimeLeftAtSubmit), clockOf(t.SubmittedAt), dash(t.TraceID))
		}
	}
	return tw.Flush()
}

func turnCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c, asJSON := inspectFlags("turn", "turn [-json] [-addr URL] <key>", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return errors.New("turn: give one turn key (dispatcher turns lists them)")
	}
	key, err := fullTurnKey(ctx, c, fs.Arg(0))
	if err != nil {
		return err
	}
	var t dispatch.TurnView
	if err := c.get(ctx, "/v1/turns/"+url.PathEscape(key), nil, &t); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, &t)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "turn\t%s\n", t.Key)
	fmt.Fprintf(tw, "object\t%s\n", t.Object)
	fmt.Fprintf(tw, "outcome\t%s (state %s)\n", t.Outcome, t.State)
	fmt.Fprintf(tw, "taken in\t%s\n", t.CreatedAt.Local().Format(time.DateTime))
	fmt.Fprintf(tw, "deadline\t%s (run expires %s)\n", t.Deadline.Local().Format(time.DateTime), t.ExpiresAt.Local().Format(time.TimeOnly))
	if t.Outcome == "open" {
		fmt.Fprintf(tw, "time left\t%s\n", timeLeft(t.TimeLeftMS))
	} else if t.SubmittedAt.IsZero() {
		fmt.Fprintf(tw, "submitted\tnever: the turn closed without a submission\n")
	} else {
		fmt.Fprintf(tw, "submitted\t%s after %s, %s before the run expired\n", t.SubmittedAt.Local().Format(time.DateTime), t.Duration, t.TimeLeftAtSubmit)
	}
	if t.Error != "" {
		fmt.Fprintf(tw, "error\t%s\n", t.Error)
	}
	fmt.Fprintf(tw, "owner\t%s\n", dash(t.Owner))
	fmt.Fprintf(tw, "trace\t%s\n\n", dash(t.TraceID))
	fmt.Fprintln(tw, "CALL\tFUNCTION\tTEAM\tRESULT\tDURATION\tEXECUTOR\tATTEMPTS\tDETAIL")
	for _, cr := range t.Calls {
		detail := ""
		switch {
		case cr.Redacted:
			detail = "(another team's call)"
		case cr.Error != nil:
			detail = string(cr.Error.Code) + ": " + cr.Error.Message
		case cr.Output != nil:
			detail = *cr.Output
		case cr.OutputPreview != "":
			detail = cr.OutputPreview + "..."
		}
		attempts := "-"
		if cr.Attempts > 0 {
			attempts = strconv.Itoa(cr.Attempts)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", cr.ID, cr.Function, cr.Team, cr.Result, dash(cr.Duration), dash(cr.Executor),
			attempts, oneLine(detail, 80))
	}
	return tw.Flush()
}

// fullTurnKey returns the turn key that key is, or that key begins (the
// console shows the first 12 characters): a prefix must name one of the
// turns the API lists, open or recently closed.
func fullTurnKey(ctx context.Context, c *apiClient, key string) (string, error) {
	if protocol.TurnKey(key).Validate() == nil || key == "" {
		return key, nil
	}
	var list dispatch.TurnList
	if err := c.get(ctx, "/v1/turns", url.Values{"limit": {"100000"}}, &list); err != nil {
		return "", err
	}
	var found []string
	for _, t := range slices.Concat(list.Open, list.Recent) {
		if strings.HasPrefix(string(t.Key), key) && !slices.Contains(found, string(t.Key)) {
			found = append(found, string(t.Key))
		}
	}
	switch len(found) {
	case 1:
		return found[0], nil
	case 0:
		return "", fmt.Errorf("turn: no open or recently closed turn begins with %q; give its whole key (32 characters)", key)
	}
	return "", fmt.Errorf("turn: %d turns begin with %q (%s); give more of the key", len(found), key, strings.Join(found, ", "))
}

// clockOf is t's local time of day, or "-" if t is zero.
func clockOf(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.Local().Format(time.TimeOnly)
}

func functionsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "reserve" || args[0] == "transfer" || args[0] == "release") {
		return namesCmd(ctx, args[0], args[1:], stdout, stderr)
	}
	fs, c, asJSON := inspectFlags("functions", "functions [-json] [-addr URL] | functions reserve|transfer|release NAME [-team T]", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var body struct {
		Functions []dispatch.FunctionView `json:"functions"`
	}
	if err := c.get(ctx, "/v1/functions", nil, &body); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, &body)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FUNCTION\tTEAM\tVERSION\tEXECUTORS\tCAP\tQUEUED\tIN FLIGHT\tDEAD\tPER MIN\tERRORS\tP50\tP99\tSCHEMA")
	for _, f := range body.Functions {
		queued, inFlight, dead := "-", "-", "-"
		if f.Queue != nil {
			queued, inFlight, dead = strconv.FormatInt(f.Queue.Queued, 10), strconv.FormatInt(f.Queue.InFlight, 10), strconv.FormatInt(f.Queue.DeadLetters, 10)
		}
		capacity := "-"
		if f.MaxConcurrency > 0 {
			capacity = strconv.Itoa(f.MaxConcurrency)
		}
		schema := f.SchemaDigest
		if len(f.Schemas) > 1 {
			schema = fmt.Sprintf("DISAGREE: %d schemas", len(f.Schemas))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%.1f\t%.0f%%\t%s\t%s\t%s\n", f.Name, f.Team, dash(f.Version), len(f.Executors), capacity,
			queued, inFlight, dead, f.Stats.PerMinute, 100*f.Stats.ErrorShare, dash(f.Stats.P50), dash(f.Stats.P99), schema)
	}
	return tw.Flush()
}

func watchesCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c, asJSON := inspectFlags("watches", "watches [-json] [-addr URL]", stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	var body struct {
		Watches []dispatch.WatchView `json:"watches"`
	}
	if err := c.get(ctx, "/v1/watches", nil, &body); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, &body)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tPLATFORM\tOBJECT\tSTATE\tSTEPS\tUPDATED\tANSWER")
	for _, w := range body.Watches {
		answer := w.Answer
		switch {
		case w.AnswerRedacted:
			answer = "(uses other teams' results)"
		case w.Error != "":
			answer = "error: " + w.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\t%s\n", w.ID, w.Platform, w.Object, w.State, w.Steps, w.MaxSteps,
			w.UpdatedAt.Local().Format(time.DateTime), oneLine(answer, 80))
	}
	return tw.Flush()
}

// timeLeft shows milliseconds left for people ("overdue" once past).
func timeLeft(ms int64) string {
	if ms < 0 {
		return "overdue " + (time.Duration(-ms) * time.Millisecond).Round(time.Second).String()
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Second).String()
}

// callsSummary counts calls by result: "2 ok, 1 timed_out".
func callsSummary(calls []dispatch.CallReport) string {
	counts := map[string]int{}
	var order []string
	for _, c := range calls {
		if counts[c.Result] == 0 {
			order = append(order, c.Result)
		}
		counts[c.Result]++
	}
	parts := make([]string, 0, len(order))
	for _, r := range order {
		parts = append(parts, fmt.Sprintf("%d %s", counts[r], r))
	}
	return dash(strings.Join(parts, ", "))
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// oneLine is s on one line, cut to at most n characters.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-3]) + "..."
	}
	return s
}
