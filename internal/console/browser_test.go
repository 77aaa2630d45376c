package console_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/toolrelay/toolrelay/internal/demo"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// -screenshots writes a screenshot of each console page into docs/ (the
// README and docs/operations.md show them); without it they go to the
// test's temporary directory.
var screenshots = flag.Bool("screenshots", false, "write the console's screenshots into docs/")

// chromiumPath finds a Chromium or Chrome to drive, or "".
func chromiumPath() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := osexec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// browser is a headless Chromium with a fresh profile, closed when the
// test ends.
type browser struct {
	t    *testing.T
	ctx  context.Context
	base string
	shot string // where screenshots go
}

func newBrowser(t *testing.T, base string) *browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		t.Skip("no chromium found on PATH (Debian: apt-get install -y chromium; .ci/run installs it)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 860),
		chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser; no timeout on this first call
		t.Fatalf("start %s: %v", path, err)
	}
	shot := t.TempDir()
	if *screenshots {
		shot = filepath.Join("..", "..", "docs")
	}
	return &browser{t: t, ctx: ctx, base: base, shot: shot}
}

// run runs actions, bounded by 30s; an error fails the test.
func (b *browser) run(actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %v\npage text:\n%s", err, b.text())
	}
}

// text is what the page shows, for failure messages.
func (b *browser) text() string {
	ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
	defer cancel()
	s, _ := chromedp.Run(ctx, chromedp.Evaluate[string](`document.body ? document.body.innerText : ""`))
	return s
}

// eval returns the value of a JavaScript expression in the page.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v\npage text:\n%s", expr, err, b.text())
	}
	return v
}

// waitJS waits until expr is true in the page, polling every 50ms.
func (b *browser) waitJS(within time.Duration, what, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("waited %s for %s (%s; last error %v)\npage text:\n%s", within, what, expr, err, b.text())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// screenshot saves the viewport as name.png.
func (b *browser) screenshot(name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	path := filepath.Join(b.shot, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	if len(png) > 300<<10 {
		b.t.Errorf("%s is %d KB; screenshots must stay well under 300 KB", path, len(png)>>10)
	}
}

// login logs in through the form with token and lands on the turns page.
func (b *browser) login(token string) {
	b.t.Helper()
	b.run(chromedp.Navigate(b.base+"/ui/turns"), chromedp.WaitVisible(chromedp.ID("token")),
		chromedp.SendKeys(chromedp.ID("token"), token), chromedp.Submit(chromedp.ID("token")),
		chromedp.WaitVisible(chromedp.ID("open-h")))
	b.waitJS(10*time.Second, "the event stream to connect", `document.getElementById("live").dataset.state === "live"`)
}

func (b *browser) logout() {
	b.t.Helper()
	b.run(chromedp.Click(chromedp.CSS(`form.logout button`)), chromedp.WaitVisible(chromedp.ID("token")))
}

// The console in a real browser against a real dispatcher, executors and
// the platform simulator: slow turns appear on the open page with a bar
// of time left that shrinks, and move to the recently closed list when
// they complete, without a reload; a dead letter is replayed from the page
// and its outcome shows; a team token sees only its team. Each page's
// screenshot is saved (into docs/ with -screenshots).
func TestConsoleInABrowser(t *testing.T) {
	s := newStack(t)
	b := newBrowser(t, s.url)
	b.login(s.tokens["admin"])

	// Slow turns, started after the page is open: they appear live.
	for range 3 {
		s.session(t, "the slow report please")
	}
	s.session(t, "what is my horoscope") // a quick one, of the demo team
	b.waitJS(20*time.Second, "three open turns", `document.querySelectorAll("#open-turns tbody tr").length === 3`)
	first := eval[[]int](b, `Array.from(document.querySelectorAll("#open-turns progress")).map(p => p.value)`)
	for _, v := range first {
		if v <= 0 || v > 100 {
			t.Errorf("time-left bars %v; want each between 1 and 100", first)
		}
	}
	b.waitJS(20*time.Second, "the bars to shrink", fmt.Sprintf(
		`Array.from(document.querySelectorAll("#open-turns progress")).every((p, i) => p.value < %v[i])`, toJS(first)))
	count := eval[string](b, `document.getElementById("open-count").textContent`)
	if count != "3" {
		t.Errorf("open count %q, want 3", count)
	}
	b.waitJS(20*time.Second, "the quick turn in the recent list", `document.querySelector("#recent-turns tbody").innerText.includes("submitted")`)
	b.screenshot("console-turns")

	s.releaseReports()
	b.waitJS(20*time.Second, "the slow turns to complete", `document.querySelectorAll("#open-turns tbody tr").length === 0 &&
		document.querySelectorAll("#recent-turns tbody tr").length >= 4`)
	recent := eval[string](b, `document.querySelector("#recent-turns tbody").innerText`)
	if strings.Count(recent, "submitted") < 4 || !strings.Contains(recent, "slow_report") {
		t.Errorf("recent turns after completing:\n%s", recent)
	}
	empty := eval[bool](b, `!document.getElementById("open-empty").hidden`)
	if !empty {
		t.Error(`"No open turns." is not shown once every turn completed`)
	}

	// A turn's page: each call with its result, executor and a trace link.
	b.run(chromedp.Navigate(s.url+"/ui/turns?function=slow_report"), chromedp.WaitVisible(chromedp.ID("recent-turns")),
		chromedp.Click(chromedp.CSS(`#recent-turns tbody tr a`)), chromedp.WaitVisible(chromedp.CSS(`dl.facts`)))
	page := b.text()
	for _, want := range []string{"slow_report", "reports-exec-1", "report ready", "submitted"} {
		if !strings.Contains(page, want) {
			t.Errorf("the turn's page lacks %q:\n%s", want, page)
		}
	}
	traceLink := eval[string](b, `(document.querySelector('a[href^="https://traces.example/trace/"]') || {}).href || ""`)
	if traceLink == "" {
		t.Error("the turn's page has no link to its trace")
	}
	b.screenshot("console-turn")

	// Dead letters: replay one from the page and see how it went.
	s.session(t, "export the ledger")
	testutil.WaitForWhat(t, 20*time.Second, "the ledger export's dead letter to be listed", func() bool {
		_, letters := s.deadLetters(t, s.tokens["admin"])
		return len(letters) == 1
	})
	b.run(chromedp.Navigate(s.url+"/ui/deadletters"), chromedp.WaitVisible(chromedp.ID("deadletters")))
	s.fixed.Store(true)
	b.run(chromedp.Click(chromedp.CSS(`#deadletters button.replay`)))
	b.waitJS(30*time.Second, "the replay's outcome", `document.querySelector("#deadletters .replay-outcome").innerText.includes("ok")`)
	outcome := eval[string](b, `document.querySelector("#deadletters .replay-outcome").innerText`)
	if !strings.Contains(outcome, "#1") || !strings.Contains(outcome, "42 rows") {
		t.Errorf("replay outcome on the page: %q; want #1 ok with the output", outcome)
	}
	b.screenshot("console-deadletters")

	b.run(chromedp.Navigate(s.url+"/ui/functions"), chromedp.WaitVisible(chromedp.ID("functions")))
	if page := b.text(); !strings.Contains(page, "slow_report") || !strings.Contains(page, "reports-exec-1") || !strings.Contains(page, "get_horoscope") {
		t.Errorf("functions page:\n%s", page)
	}
	b.screenshot("console-functions")
	b.run(chromedp.Navigate(s.url+"/ui/watches"), chromedp.WaitVisible(chromedp.ID("watches")))
	b.waitJS(5*time.Second, "the watches", `document.querySelectorAll("#watches tbody tr").length === 5`)
	if page := b.text(); !strings.Contains(page, "report ready") || !strings.Contains(page, "Aquarius") {
		t.Errorf("watches page:\n%s", page)
	}
	b.screenshot("console-watches")

	// A phone: the turns page still reads.
	b.run(chromedp.EmulateViewport(390, 844, chromedp.EmulateScale(2)), chromedp.Navigate(s.url+"/ui/turns"), chromedp.WaitVisible(chromedp.ID("recent-turns")))
	overflow := eval[bool](b, `document.documentElement.scrollWidth > window.innerWidth + 1`)
	if overflow {
		t.Error("on a phone the page is wider than the screen (only tables may scroll sideways)")
	}
	b.screenshot("console-turns-phone")
	b.run(chromedp.EmulateViewport(1280, 860))

	// The demo team's token: its turns and functions only, no dead letters.
	b.logout()
	b.login(s.tokens[demo.Team])
	recent = eval[string](b, `document.querySelector("#recent-turns tbody").innerText`)
	if !strings.Contains(recent, "get_horoscope") || strings.Contains(recent, "slow_report") || strings.Contains(recent, "flaky_export") {
		t.Errorf("the demo team's recent turns:\n%s", recent)
	}
	b.run(chromedp.Navigate(s.url+"/ui/functions"), chromedp.WaitVisible(chromedp.ID("functions")))
	if page := b.text(); strings.Contains(page, "slow_report") || !strings.Contains(page, "get_horoscope") {
		t.Errorf("the demo team's functions page:\n%s", page)
	}
	b.run(chromedp.Navigate(s.url+"/ui/deadletters"), chromedp.WaitVisible(chromedp.CSS(`main`)))
	if page := b.text(); !strings.Contains(page, "No dead letters") {
		t.Errorf("the demo team's dead letters page:\n%s", page)
	}
	who := eval[string](b, `document.getElementById("who").innerText`)
	if !strings.Contains(who, "teams demo") {
		t.Errorf("the page says it is %q; want the demo team's token", who)
	}
}

// toJS writes ints as a JavaScript array.
func toJS(vs []int) string {
	s := make([]string, len(vs))
	for i, v := range vs {
		s[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(s, ",") + "]"
}
