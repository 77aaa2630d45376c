package demo

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

// The demo plays a scenario per platform, one through /mcp, one whose MCP
// approval request a person approves before the conversation goes on,
// and an MCP client's call longer than the client waits, as a task:
// created on a second replica, which stops, and read from the first.
func TestDemoPlaysEveryPlatform(t *testing.T) {
	var out bytes.Buffer
	if err := Run(t.Context(), Options{Out: &out, DataDir: t.TempDir(), Timeout: 30 * time.Second}); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	got := out.String()
	for _, want := range []string{
		"[agents]", "[assistants]", "[responses]",
		"Calling get_customer...", "Calling get_weather...", "Calling getUserFavoriteCity...",
		"Calling getCityNickname...", "Calling getCurrentWeatherAtLocation...", "Calling get_horoscope...",
		"Customer 123 is Example Customer on the pro plan.",
		"Your favorite city, Seattle, WA, is also known as The Emerald City. The current weather there is 70f.",
		"Aquarius: Next Tuesday you will befriend a baby otter.",
		`Calling get_sign_dates... (custom tool, input "Aquarius")`,
		"answer: Your horoscope: Aquarius: Next Tuesday you will befriend a baby otter. Aquarius birthdays fall between January 20 and February 18.",
		"turn submitted: 2 call(s)",
		"[mcp]", "platform: mcp_list_tools, 6 tools from toolrelay",
		`platform: mcp_call getCurrentWeatherAtLocation{"location":"Seattle, WA","unit":"f"} -> 70f`,
		"tools/call getUserFavoriteCity", "turn mcp",
		"[mcp approval]", `platform: mcp_approval_request issue_refund{"order":"A-1001","amount":250} on toolrelay`,
		"toolrelay: issue_refund awaiting_approval by admin or team", `: "the carrier confirmed the loss"`, "Calling issue_refund...",
		"platform: mcp_approval_response approve=true, then mcp_call issue_refund -> refunded 250.00 for order A-1001",
		"answer: Done: refunded 250.00 for order A-1001",
		"[mcp task]", "Calling build_report...", "replica 2: resultType task, ", " working (ttlMs 3600000, pollIntervalMs 2000)",
		"the client disconnects; replica 2 stops",
		`client -> replica 1: tasks/get -> completed: {"orders":1284,"quarter":"2026-Q3","revenue":"412,300 USD"}`,
	} {
		if !strings.Contains(got, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(got)
	}
}

// TestSignDates: the custom tool takes the sign's name as text; its
// grammar admits exactly the twelve signs, each of which has dates.
func TestSignDates(t *testing.T) {
	var signDates exec.Function
	for _, f := range Functions() {
		if f.Name == "get_sign_dates" {
			signDates = f
		}
	}
	if signDates.Format == nil {
		t.Fatal("get_sign_dates is not a custom tool")
	}
	re, err := signDates.Format.Regex()
	if err != nil {
		t.Fatal(err)
	}
	for _, sign := range strings.Split(signGrammar, "|") {
		if !re.MatchString(sign) {
			t.Errorf("the grammar refuses %q", sign)
		}
		out, err := signDates.Handler.Handle(t.Context(), textInvocation("get_sign_dates", sign))
		if err != nil || !strings.HasPrefix(string(out), sign+" birthdays fall between ") {
			t.Errorf("get_sign_dates(%s) = %q, %v", sign, out, err)
		}
	}
	for _, input := range []string{"Ophiuchus", "aquarius", "Aquarius ", "Leo|Virgo", ""} {
		if re.MatchString(input) {
			t.Errorf("the grammar admits %q", input)
		}
	}
}

func TestSeedFunctions(t *testing.T) {
	// get_customer answers for 123 and fails clearly otherwise.
	var getCustomer = Functions()[0]
	if getCustomer.Name != "get_customer" {
		t.Fatal("seed order changed")
	}
	out, err := getCustomer.Handler.Handle(t.Context(), invocation("get_customer", `{"customer_id":"123"}`))
	if err != nil || string(out) != `{"name":"Example Customer","plan":"pro"}` {
		t.Errorf("get_customer(123) = %s, %v", out, err)
	}
	if _, err := getCustomer.Handler.Handle(t.Context(), invocation("get_customer", `{"customer_id":"9"}`)); err == nil || !strings.Contains(err.Error(), "no customer") {
		t.Errorf("get_customer(9) error = %v", err)
	}
}
