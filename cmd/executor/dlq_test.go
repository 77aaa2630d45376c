package main

import (
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// dlq list shows the whole first line of a failure's message, and a
// message of several lines, or with tabs, keeps the table one row per
// dead letter; the newest comes first, as in the console.
func TestDLQListShowsTheFirstLineOfTheMessage(t *testing.T) {
	c := newCluster(t)
	script := filepath.Join(c.dir, "charge.sh")
	if err := os.WriteFile(script, []byte(`printf 'the card processor rejected the charge\tcode 51: insufficient funds on the card ending 4242, ask for another card\ntrace id 7f3a\n' >&2
exit 3
`), 0o644); err != nil {
		t.Fatal(err)
	}
	c.executor("exec-a", writeFile(t, fmt.Sprintf(`functions:
  - name: charge_card
    owner: billing
    command: ["sh", %q]
`, script)))
	c.waitServing("billing", "charge_card")
	first := c.call("billing", "charge_card")
	testutil.WaitForWhat(t, 20*time.Second, "billing's failed call to be dead-lettered", func() bool {
		dls, err := exec.NewDeadLetters(c.js).List(context.Background(), "billing")
		return err == nil && len(dls) == 1
	})
	second := c.callIn("as_kill/turn_2", "billing", "charge_card")
	testutil.WaitForWhat(t, 20*time.Second, "billing's second failed call to be dead-lettered", func() bool {
		dls, err := exec.NewDeadLetters(c.js).List(context.Background(), "billing")
		return err == nil && len(dls) == 2
	})

	cmd := osexec.Command(executorBin, "dlq", "list")
	cmd.Env = append(os.Environ(), "NATS_URL="+c.srv.ClientURL())
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("executor dlq list: %v\n%s", err, out)
	}
	rows := strings.Split(strings.TrimRight(string(out), "\n"), "\n")
	if len(rows) != 3 || !strings.HasPrefix(rows[0], "AT ") {
		t.Fatalf("want a header and two rows, got:\n%s", out)
	}
	if !strings.Contains(rows[1], string(second.Key)) || !strings.Contains(rows[2], string(first.Key)) {
		t.Errorf("want the newest dead letter (%s) first, then %s:\n%s", second.Key, first.Key, out)
	}
	want := "function_error: charge_card failed (exit status 3): the card processor rejected the charge " +
		"code 51: insufficient funds on the card ending 4242, ask for another card …"
	if !strings.HasSuffix(rows[1], want) {
		t.Errorf("row:\n%s\nwant it to end with:\n%s", rows[1], want)
	}
}
