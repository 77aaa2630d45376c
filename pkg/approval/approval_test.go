package approval_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/toolrelay/toolrelay/pkg/approval"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestEvaluate(t *testing.T) {
	for _, tc := range []struct {
		name    string
		policy  protocol.ApprovalPolicy
		args    string
		want    bool
		wantErr bool
	}{
		{name: "required", policy: protocol.ApprovalPolicy{Required: true}, args: `{}`, want: true},
		{name: "over", policy: protocol.ApprovalPolicy{When: "args.amount > 100"}, args: `{"amount":150}`, want: true},
		{name: "under", policy: protocol.ApprovalPolicy{When: "args.amount > 100"}, args: `{"amount":20.5}`, want: false},
		{name: "string", policy: protocol.ApprovalPolicy{When: `args.account.startsWith("ext-")`}, args: `{"account":"ext-9"}`, want: true},
		{name: "guarded missing", policy: protocol.ApprovalPolicy{When: "has(args.amount) && args.amount > 100"}, args: `{}`, want: false},
		{name: "missing field needs approval", policy: protocol.ApprovalPolicy{When: "args.amount > 100"}, args: `{}`, want: true, wantErr: true},
		{name: "not an object", policy: protocol.ApprovalPolicy{When: "has(args.amount)"}, args: `"text"`, want: false},
		{name: "costly", policy: protocol.ApprovalPolicy{When: "args.xs.all(x, args.xs.all(y, args.xs.all(z, x+y+z >= 0)))"}, args: `{"xs":[` + strings.Repeat("1,", 99) + `1]}`, want: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := approval.Compile("refund", "billing", &tc.policy)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.Evaluate(json.RawMessage(tc.args))
			if got != tc.want || (err != nil) != tc.wantErr {
				t.Errorf("Evaluate(%s) = %v, %v; want %v, error %v", tc.args, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestCompileRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		policy protocol.ApprovalPolicy
		says   string
	}{
		{name: "syntax", policy: protocol.ApprovalPolicy{When: "args.amount >"}, says: "Syntax error"},
		{name: "not bool", policy: protocol.ApprovalPolicy{When: "args.amount + 1"}, says: "not bool"},
		{name: "unknown variable", policy: protocol.ApprovalPolicy{When: "amount > 1"}, says: "undeclared reference"},
		{name: "both", policy: protocol.ApprovalPolicy{Required: true, When: "true"}, says: "not both"},
		{name: "neither", policy: protocol.ApprovalPolicy{}, says: "neither"},
		{name: "too long", policy: protocol.ApprovalPolicy{When: strings.Repeat("true && ", 200) + "true"}, says: "MaxApprovalExpressionSize"},
		{name: "bad approver", policy: protocol.ApprovalPolicy{Required: true, Approvers: []string{"a b"}}, says: "approver"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := approval.Compile("refund", "billing", &tc.policy)
			if !errors.Is(err, approval.ErrInvalid) || !strings.Contains(err.Error(), "function refund") || !strings.Contains(err.Error(), tc.says) {
				t.Errorf("Compile = %v; want ErrInvalid naming refund and saying %q", err, tc.says)
			}
		})
	}
}

func TestMayDecide(t *testing.T) {
	def, _ := approval.Compile("refund", "billing", &protocol.ApprovalPolicy{Required: true})
	named, _ := approval.Compile("refund", "billing", &protocol.ApprovalPolicy{Required: true, Approvers: []string{"alice", protocol.ApproverAdmin}})
	for _, tc := range []struct {
		name   string
		policy *approval.Policy
		d      approval.Decider
		want   bool
	}{
		{"admin", def, approval.Decider{Name: "root", Admin: true}, true},
		{"owning team", def, approval.Decider{Name: "b", Teams: []string{"billing"}}, true},
		{"other team", def, approval.Decider{Name: "s", Teams: []string{"search"}}, false},
		{"agent token", def, approval.Decider{Name: "agent", Teams: []string{"billing"}, ToolsOnly: true}, false},
		{"named", named, approval.Decider{Name: "alice", Teams: []string{"search"}}, true},
		{"team not named", named, approval.Decider{Name: "b", Teams: []string{"billing"}}, false},
		{"admin named", named, approval.Decider{Name: "root", Admin: true}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.policy.MayDecide(tc.d); got != tc.want {
				t.Errorf("MayDecide(%+v) = %v, want %v", tc.d, got, tc.want)
			}
		})
	}
}

// FuzzPolicy checks that no condition and no arguments make Compile or
// Evaluate panic, and that a policy that compiles passes its shape check.
func FuzzPolicy(f *testing.F) {
	f.Add("args.amount > 100", `{"amount":150}`)
	f.Add(`args.a.exists(x, x == "b")`, `{"a":["b"]}`)
	f.Add("1/0 == 1", `{}`)
	f.Add("args", `null`)
	f.Fuzz(func(t *testing.T, when, args string) {
		spec := &protocol.ApprovalPolicy{When: when}
		p, err := approval.Compile("f", "t", spec)
		if err != nil {
			return
		}
		if err := spec.Validate("f"); err != nil {
			t.Fatalf("compiled a policy its shape check refuses: %v", err)
		}
		if need, err := p.Evaluate(json.RawMessage(args)); err != nil && !need {
			t.Fatalf("an evaluation error must require approval: %v", err)
		}
	})
}
