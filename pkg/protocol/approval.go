package protocol

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// ApprovalPolicy says which calls of a function wait for a person before
// any executor sees them, and who may decide. A call needs approval when
// Required is set, or when the CEL expression When, over the call's
// arguments as args (args.amount > 100), is true. Package approval
// compiles and evaluates it; this package checks only its shape.
type ApprovalPolicy struct {
	Required bool   `json:"required,omitempty"`
	When     string `json:"when,omitempty"`
	// Approvers may decide: ApproverAdmin (admin tokens), ApproverTeam
	// (tokens scoped to the owning team) or a token's name. Empty: admin
	// and team.
	Approvers []string `json:"approvers,omitempty"`
}

// Approvers a policy may name besides token names.
const (
	ApproverAdmin = "admin"
	ApproverTeam  = "team"
)

// Bounds of an approval policy.
const (
	// MaxApprovalExpressionSize bounds When, in bytes.
	MaxApprovalExpressionSize = 1 << 10
	// MaxApprovers bounds Approvers.
	MaxApprovers = 16
)

// Validate reports what is wrong with the shape of function's policy p:
// neither or both of Required and When, a When over its bound, too many
// or malformed approvers. It does not compile When.
func (p *ApprovalPolicy) Validate(function string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: function %s: approval: %s", ErrMalformed, function, fmt.Sprintf(format, args...))
	}
	when := strings.TrimSpace(p.When)
	switch {
	case p.Required == (when != ""):
		return bad("set either required: true or a when: condition, not both or neither")
	case len(p.When) > MaxApprovalExpressionSize:
		return bad("when is %d bytes, over the limit of %d (MaxApprovalExpressionSize)", len(p.When), MaxApprovalExpressionSize)
	case !utf8.ValidString(p.When):
		return bad("when is not valid UTF-8")
	case len(p.Approvers) > MaxApprovers:
		return bad("%d approvers; at most %d (MaxApprovers)", len(p.Approvers), MaxApprovers)
	}
	for _, a := range p.Approvers {
		if !validPrincipal(a) {
			return bad("approver %.70q is not admin, team or a token's name (letters, digits, '.', '_', '-', '@')", a)
		}
	}
	return nil
}

// validPrincipal accepts a token's name as the dispatcher's tokens file
// allows it: 1 to 64 letters, digits, '.', '_', '-' or '@'.
func validPrincipal(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._-@", c) >= 0) {
			return false
		}
	}
	return true
}

// ApprovalSubjectPrefix starts the subjects the dispatchers announce held
// calls on, in their own account: <prefix>.requested.<team> when a call is
// held, <prefix>.decided.<team> when it is decided, each carrying the
// held call's record as JSON. A deployment with an account per team
// (dispatcher nats-config) lets each team subscribe to its own.
const ApprovalSubjectPrefix = "toolrelay.approval"

// ApprovalRequestedSubject is where team's held calls are announced.
func ApprovalRequestedSubject(team string) string {
	return ApprovalSubjectPrefix + ".requested." + team
}

// ApprovalDecidedSubject is where decisions on team's held calls are
// announced.
func ApprovalDecidedSubject(team string) string { return ApprovalSubjectPrefix + ".decided." + team }
