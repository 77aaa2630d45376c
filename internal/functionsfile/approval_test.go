package functionsfile

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A function's approval is the word required or a mapping with a CEL
// condition; a condition that does not compile is refused under approval,
// naming the function, before the file serves anything.
func TestApproval(t *testing.T) {
	const fn = "functions:\n  - name: refund\n    owner: billing\n    side_effects: true\n    command: [\"cat\"]\n"
	for name, c := range map[string]struct {
		body string
		want protocol.ApprovalPolicy
	}{
		"required": {"    approval: required\n", protocol.ApprovalPolicy{Required: true}},
		"condition": {"    approval:\n      when: args.amount > 100\n      approvers: [team, alice]\n",
			protocol.ApprovalPolicy{When: "args.amount > 100", Approvers: []string{"team", "alice"}}},
	} {
		teams, err := Load(testutil.WriteFile(t, "functions.yaml", fn+c.body))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if diff := cmp.Diff(&c.want, teams["billing"][0].Approval); diff != "" {
			t.Errorf("%s: policy (-want +got):\n%s", name, diff)
		}
	}
	for name, c := range map[string]struct{ body, want string }{
		"bad expression": {"    approval: {when: \"args.amount >\"}\n", "(refund): approval:"},
		"not bool":       {"    approval: {when: \"args.amount + 1\"}\n", "not bool"},
		"misspelt key":   {"    approval: {required: true, aprovers: [alice]}\n", `unknown key "aprovers"`},
		"other word":     {"    approval: always\n", "approval: required"},
		"both":           {"    approval: {required: true, when: \"true\"}\n", "not both"},
	} {
		_, err := Load(testutil.WriteFile(t, "functions.yaml", fn+c.body))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v; want an error saying %q", name, err, c.want)
		}
	}
}
