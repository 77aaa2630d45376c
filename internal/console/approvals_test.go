package console_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// Calls held for approval come first on the console's landing page, with
// their arguments and time left, and are decided there: approve runs the
// call; deny wants a reason, which the call's failure then carries. The
// approvals page lists them too, and another team sees none of them.
func TestApprovalsInTheConsole(t *testing.T) {
	s := newStack(t)
	ctx := context.Background()
	start := func(month string) *dispatch.StartedCall {
		t.Helper()
		c, err := s.d.StartCall(ctx, "console-test", dispatch.DirectCall{Function: "purge_report",
			Arguments: json.RawMessage(`{"month":"` + month + `"}`), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	approved, denied := start("2026-09"), start("2026-10")

	b := newBrowser(t, s.url)
	b.login(s.tokens["reports"])
	b.waitJS(10*time.Second, "two held calls atop the turns", `document.querySelectorAll("#approvals tbody tr").length === 2`)
	if got := eval[string](b, `document.querySelector("main section").id || document.querySelector("main section h2").id`); got != "approvals-h" {
		t.Errorf("the first section of the turns page is %q, want the held calls", got)
	}
	table := eval[string](b, `document.getElementById("approvals").innerText`)
	for _, want := range []string{"purge_report", "2026-09", "2026-10", "admin, team"} {
		if !strings.Contains(table, want) {
			t.Errorf("held calls table lacks %q:\n%s", want, table)
		}
	}
	b.screenshot("console-approvals")

	row := func(month string) string {
		return `Array.from(document.querySelectorAll("#approvals tbody tr")).find(r => r.innerText.includes("` + month + `"))`
	}
	do := func(js string) { t.Helper(); eval[bool](b, "("+js+", true)") }
	do(row("2026-09") + `.querySelector("button.approve").click()`)
	b.waitJS(10*time.Second, "the approval to show", row("2026-09")+`.querySelector(".decide").innerText.includes("approved by reports")`)
	do(row("2026-10") + `.querySelector("button.deny").click()`)
	b.waitJS(5*time.Second, "a reason to be asked for", `document.getElementById("approval-status").innerText.includes("Give a reason")`)
	do(row("2026-10") + `.querySelector("input.reason").value = "keep it for the audit"`)
	do(row("2026-10") + `.querySelector("button.deny").click()`)
	b.waitJS(10*time.Second, "the denial to show", row("2026-10")+`.querySelector(".decide").innerText.includes("denied by reports")`)

	for _, tc := range []struct {
		c    *dispatch.StartedCall
		want string
	}{{approved, `"purged"`}, {denied, "reports denied it: keep it for the audit"}} {
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		got, err := s.d.StartedCall(wctx, "console-test", tc.c.Key, true)
		cancel()
		if err != nil || got.State != dispatch.CallDone || got.Result == nil {
			t.Fatalf("started call %s: %+v, %v; want it done", tc.c.Key, got, err)
		}
		out := got.Result.Output
		if got.Result.Error != nil {
			out = got.Result.Error.Message
		}
		if !strings.Contains(out, tc.want) {
			t.Errorf("call %s: %q, want %q", tc.c.Key, out, tc.want)
		}
	}

	b.run(chromedp.Navigate(s.url+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if page := b.text(); !strings.Contains(page, "No calls await approval") {
		t.Errorf("the approvals page once both are decided:\n%s", page)
	}
	b.logout()
	third := start("2026-11")
	b.login(s.tokens["demo"])
	b.run(chromedp.Navigate(s.url+"/ui/approvals"), chromedp.WaitVisible(chromedp.CSS("main h1")))
	if page := b.text(); strings.Contains(page, "purge_report") || strings.Contains(page, string(third.Key)) {
		t.Errorf("the demo team sees reports' held call:\n%s", page)
	}
}
