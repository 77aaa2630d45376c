// Package approval evaluates a function's approval policy
// (protocol.ApprovalPolicy): whether a call needs a person's decision
// before it runs, and who may decide it. Conditions are CEL expressions
// over the call's arguments, as args (github.com/google/cel-go).
//
// The dispatcher evaluates a call's policy once, at intake; the executor
// library compiles it when a function is registered, so a bad expression
// is refused where it is written. A [Policy] is safe for concurrent use.
//
// # Conditions
//
// A condition is a CEL expression of type bool over args, the call's
// arguments decoded from JSON (numbers are doubles, compared freely with
// integers): args.amount > 100, args.account.startsWith("ext-"),
// "refund" in args.tags. A condition that cannot be evaluated for a call
// (a field it reads is missing, say: write has(args.amount) &&
// args.amount > 100 to allow that) requires approval, and
// [Policy.Evaluate] says why. A condition is at most
// protocol.MaxApprovalExpressionSize bytes, and one evaluation at most
// [MaxCost] of CEL's cost units: one that costs more requires approval.
package approval

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/google/cel-go/cel"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// MaxCost bounds one evaluation of a condition, in CEL's cost units
// (about one per operation, a few per list element visited).
const MaxCost = 10_000

// ErrInvalid wraps what is wrong with a policy: its shape, or a condition
// that does not compile or is not a bool.
var ErrInvalid = errors.New("approval: invalid policy")

// Policy is a function's compiled approval policy.
type Policy struct {
	spec     protocol.ApprovalPolicy
	function string
	team     string
	prg      cel.Program // nil when every call needs approval
}

// Compile checks and compiles function's policy p; team owns the
// function. Errors wrap [ErrInvalid] and name the function.
func Compile(function, team string, p *protocol.ApprovalPolicy) (*Policy, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: function %s: no policy", ErrInvalid, function)
	}
	if err := p.Validate(function); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	pol := &Policy{spec: *p, function: function, team: team}
	pol.spec.Approvers = slices.Clone(p.Approvers)
	if p.Required {
		return pol, nil
	}
	prg, err := compiled(p.When)
	if err != nil {
		return nil, fmt.Errorf("%w: function %s: approval: when %.80q: %w", ErrInvalid, function, p.When, err)
	}
	pol.prg = prg
	return pol, nil
}

// Spec returns the policy as declared.
func (p *Policy) Spec() protocol.ApprovalPolicy {
	s := p.spec
	s.Approvers = slices.Clone(p.spec.Approvers)
	return s
}

// Approvers returns who may decide, defaults applied: admin and team
// when the policy names nobody.
func (p *Policy) Approvers() []string {
	if len(p.spec.Approvers) == 0 {
		return []string{protocol.ApproverAdmin, protocol.ApproverTeam}
	}
	return slices.Clone(p.spec.Approvers)
}

// Evaluate reports whether a call with args needs approval. A condition
// that cannot be evaluated for args needs it: the result is true, and the
// error says why (for the log; the call still waits for a decision).
func (p *Policy) Evaluate(args json.RawMessage) (bool, error) {
	if p.prg == nil {
		return true, nil
	}
	var v any
	if err := json.Unmarshal(args, &v); err != nil {
		return true, fmt.Errorf("approval: function %s: arguments are not JSON: %w", p.function, err)
	}
	if _, ok := v.(map[string]any); !ok {
		v = map[string]any{} // a function's arguments are an object; a custom tool's text has no fields
	}
	out, _, err := p.prg.Eval(map[string]any{"args": v})
	if err != nil {
		return true, fmt.Errorf("approval: function %s: when %.80q: %w", p.function, p.spec.When, err)
	}
	b, ok := out.Value().(bool)
	if !ok {
		return true, fmt.Errorf("approval: function %s: when %.80q gave %v, not a bool", p.function, p.spec.When, out.Value())
	}
	return b, nil
}

// Decider is who asks to decide a call: the name of its token, and its
// scope as the dispatcher's API gives it.
type Decider struct {
	Name  string
	Admin bool
	Teams []string
	// ToolsOnly deciders (an agent's token) never decide.
	ToolsOnly bool
}

// MayDecide reports whether d may approve or deny the policy's calls: an
// admin where the approvers name admin, a token scoped to the owning team
// where they name team, and a token named among them.
func (p *Policy) MayDecide(d Decider) bool {
	return MayDecide(p.Approvers(), p.team, d)
}

// MayDecide reports whether d may decide a call of team's function whose
// policy names approvers (defaults applied; see [Policy.Approvers]): for a
// decision on a call whose record kept its approvers, with no policy to
// compile.
func MayDecide(approvers []string, team string, d Decider) bool {
	if d.ToolsOnly {
		return false
	}
	for _, a := range approvers {
		switch a {
		case protocol.ApproverAdmin:
			if d.Admin {
				return true
			}
		case protocol.ApproverTeam:
			if d.Admin || slices.Contains(d.Teams, team) {
				return true
			}
		default:
			if d.Name != "" && d.Name == a {
				return true
			}
		}
	}
	return false
}

// The environment is made once, and each condition compiled once per
// process: declarations are renewed every few seconds, and compiling is
// what costs.
var (
	env = sync.OnceValues(func() (*cel.Env, error) {
		return cel.NewEnv(
			cel.Variable("args", cel.MapType(cel.StringType, cel.DynType)),
			cel.CrossTypeNumericComparisons(true),
			cel.ParserExpressionSizeLimit(protocol.MaxApprovalExpressionSize),
		)
	})
	cacheMu sync.Mutex
	cache   = map[string]cel.Program{}
)

// maxCached bounds the compiled conditions kept; past it the cache starts
// over (conditions are few: one per function that has one).
const maxCached = 1024

func compiled(expr string) (cel.Program, error) {
	expr = strings.TrimSpace(expr)
	cacheMu.Lock()
	prg := cache[expr]
	cacheMu.Unlock()
	if prg != nil {
		return prg, nil
	}
	e, err := env()
	if err != nil {
		return nil, err
	}
	ast, iss := e.Compile(expr)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if !ast.OutputType().IsExactType(cel.BoolType) && !ast.OutputType().IsExactType(cel.DynType) {
		return nil, fmt.Errorf("is of type %s, not bool", ast.OutputType())
	}
	prg, err = e.Program(ast, cel.CostLimit(MaxCost), cel.InterruptCheckFrequency(100))
	if err != nil {
		return nil, err
	}
	cacheMu.Lock()
	if len(cache) >= maxCached {
		clear(cache)
	}
	cache[expr] = prg
	cacheMu.Unlock()
	return prg, nil
}
