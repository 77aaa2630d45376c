package demo

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

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
		"turn submitted: 2 call(s)",
		"[mcp]", "platform: mcp_list_tools, 6 tools from toolrelay",
		`platform: mcp_call getCurrentWeatherAtLocation{"location":"Seattle, WA","unit":"f"} -> 70f`,
		"tools/call getUserFavoriteCity", "turn mcp",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("demo output lacks %q", want)
		}
	}
	if t.Failed() {
		t.Log(got)
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
