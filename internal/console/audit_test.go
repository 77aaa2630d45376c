package console_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/toolrelay/toolrelay/internal/demo"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// The console's Audit page lists the trail newest first, as GET /v1/audit
// reads it for the caller: a held call's request and its denial with who
// and why. Another team sees none of it, and asking for the team's trail
// by name is refused.
func TestAuditInTheConsole(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	c, err := s.d.StartCall(ctx, "console-test", dispatch.DirectCall{Function: "purge_report",
		Arguments: json.RawMessage(`{"month":"2026-08"}`), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	reports := dispatch.Caller{Name: "reports", Teams: []string{"reports"}}
	var held []*dispatch.Approval
	testutil.WaitForWhat(t, 10*time.Second, "the call to await approval", func() bool {
		held, err = s.d.Approvals(ctx, reports, dispatch.ApprovalQuery{})
		return err == nil && len(held) == 1
	})
	if _, err := s.d.Decide(ctx, reports, held[0].CallKey, dispatch.Decision{Reason: "the auditors need it"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.d.StartedCall(ctx, "console-test", c.Key, true); err != nil {
		t.Fatal(err)
	}

	b := newBrowser(t, s.url)
	b.login(s.tokens["reports"])
	b.run(chromedp.Navigate(s.url+"/ui/audit"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	b.waitJS(10*time.Second, "the request and its denial", `document.querySelectorAll("#audit tbody tr").length === 2`)
	kinds := eval[string](b, `Array.from(document.querySelectorAll("#audit tbody tr")).map(r => r.dataset.kind).join(",")`)
	if kinds != "denied,requested" {
		t.Errorf("rows %q, want the denial, then the request", kinds)
	}
	table := eval[string](b, `document.getElementById("audit").innerText`)
	for _, want := range []string{"purge_report", "reports", "the auditors need it", "2026-08"} {
		if !strings.Contains(table, want) {
			t.Errorf("audit table lacks %q:\n%s", want, table)
		}
	}
	b.screenshot("console-audit")
	b.logout()

	b.login(s.tokens[demo.Team])
	b.run(chromedp.Navigate(s.url+"/ui/audit"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if page := b.text(); strings.Contains(page, "purge_report") || !strings.Contains(page, "No entries") {
		t.Errorf("the demo team's audit page shows reports' entries:\n%s", page)
	}
	req, _ := http.NewRequest(http.MethodGet, s.url+"/ui/audit?team=reports", nil)
	req.Header.Set("Authorization", "Bearer "+s.tokens[demo.Team])
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("the demo team asking for reports' trail: %d, want 403", resp.StatusCode)
	}
	req, _ = http.NewRequest(http.MethodGet, s.url+"/ui/audit?since=yesterday", nil)
	req.Header.Set("Authorization", "Bearer "+s.tokens["admin"])
	if resp, err = http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("since=yesterday: %d, want 400", resp.StatusCode)
	}
}
