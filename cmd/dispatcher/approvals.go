package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// The approval commands (approvals, approve, deny) and audit read and
// decide through a running dispatcher's HTTP API, under its token rules,
// as the console does.

func approvalsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c, asJSON := inspectFlags("approvals", "approvals [-team T] [-all] [-json] [-addr URL]", stderr)
	team := fs.String("team", "", "only this team's held calls")
	all := fs.Bool("all", false, "decided calls too, not only those awaiting a decision")
	if err := fs.Parse(args); err != nil {
		return err
	}
	q := url.Values{}
	if *team != "" {
		q.Set("team", *team)
	}
	if *all {
		q.Set("all", "1")
	}
	var list struct {
		Approvals []httpapi.ApprovalView `json:"approvals"`
	}
	if err := c.get(ctx, "/v1/approvals", q, &list); err != nil {
		return err
	}
	if *asJSON {
		return printJSON(stdout, &list)
	}
	if len(list.Approvals) == 0 {
		fmt.Fprintln(stdout, "no calls await approval")
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CALL\tTEAM\tFUNCTION\tSTATE\tLEFT\tAPPROVERS\tARGUMENTS")
	for _, a := range list.Approvals {
		state := string(a.State)
		if a.DecidedBy != "" {
			state += " by " + a.DecidedBy
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", a.CallKey, a.Team, a.Function, state, timeLeft(a.TimeLeftMS),
			strings.Join(a.Approvers, ","), clip(string(a.Arguments), 80))
	}
	return tw.Flush()
}

func decideCmd(verb string) func(context.Context, []string, io.Writer, io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		fs, c, asJSON := inspectFlags(verb, verb+" [-reason R] [-json] [-addr URL] <call key>", stderr)
		reason := fs.String("reason", "", "why; the model reads it when the call is denied")
		keys, err := parseAround(fs, args)
		if err != nil {
			return err
		}
		if len(keys) != 1 {
			fs.Usage()
			return fmt.Errorf("%s: give one call key (dispatcher approvals lists them)", verb)
		}
		if verb == "deny" && strings.TrimSpace(*reason) == "" {
			return errors.New("deny: give a -reason: the model reads it, and acts on it")
		}
		body, _ := json.Marshal(map[string]string{"reason": *reason})
		answer, err := c.do(ctx, http.MethodPost, "/v1/approvals/"+url.PathEscape(keys[0])+"/"+verb, nil, body)
		if err != nil {
			return err
		}
		var a httpapi.ApprovalView
		if err := json.Unmarshal(answer, &a); err != nil {
			return fmt.Errorf("%s: decode the answer: %w", verb, err)
		}
		if *asJSON {
			return printJSON(stdout, &a)
		}
		fmt.Fprintf(stdout, "%s %s of %s: %s by %s\n", a.CallKey, a.Function, a.Team, a.State, a.DecidedBy)
		return nil
	}
}

func auditCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, c, asJSON := inspectFlags("audit", "audit [-team T] [-since 24h|RFC3339] [-limit N] [-json] [-addr URL]", stderr)
	team := fs.String("team", "", "only this team's entries")
	since := fs.String("since", "", "entries from this time (RFC 3339) or this long ago (24h)")
	limit := fs.Int("limit", 0, "at most this many entries, the oldest first (default and at most 10000)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	q := url.Values{}
	if *team != "" {
		q.Set("team", *team)
	}
	if *since != "" {
		q.Set("since", *since)
	}
	if *limit > 0 {
		q.Set("limit", strconv.Itoa(*limit))
	}
	body, err := c.do(ctx, http.MethodGet, "/v1/audit", q, nil)
	if err != nil {
		return err
	}
	if *asJSON { // JSON lines, as the API gives them: one entry a line
		_, err := stdout.Write(body)
		return err
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tKIND\tTEAM\tFUNCTION\tCALL\tBY\tOUTCOME\tDETAIL")
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var e dispatch.AuditEntry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("audit: decode an entry: %w", err)
		}
		detail := e.Reason
		switch e.Kind {
		case "requested":
			detail = clip(string(e.Arguments), 60)
		case "run":
			detail = e.Error
			if e.TraceID != "" {
				detail = strings.TrimSpace(detail + " trace " + e.TraceID)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", e.At.Local().Format(time.DateTime), e.Kind, e.Team, e.Function, e.CallKey,
			dash(e.By), dash(e.Outcome), clip(detail, 80))
	}
	return tw.Flush()
}

// parseAround parses args with fs, flags before or after the positional
// arguments (deny KEY -reason R reads as it is written), and returns the
// positional ones.
func parseAround(fs *flag.FlagSet, args []string) ([]string, error) {
	var rest []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return rest, nil
		}
		rest, args = append(rest, fs.Arg(0)), fs.Args()[1:]
	}
}

// clip shortens s to n bytes for a table, marking the cut.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
