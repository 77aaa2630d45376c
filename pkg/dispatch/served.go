package dispatch

import (
	"bytes"
	"context"
	"fmt"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// What front doors read of the live registry: the tools agents are given
// and the function a client calls.

// ServedFunctions returns the functions a live executor of their owning
// team serves now, of the teams sees accepts, by name: each as its newest
// live declaration describes it, or, with [Options.DefinitionApproval],
// with the description and schema last accepted. Before Run is ready
// ([Dispatcher.Ready]) the list may be incomplete.
func (d *Dispatcher) ServedFunctions(sees func(team string) bool) []*protocol.FunctionSpec {
	return d.registry.served(sees, d.opts.DefinitionApproval)
}

// Function returns how the fleet serves the function name now: its owning
// team's claim (Accepted), its live executors, newest first, and the
// newest one's declaration (Spec; the claim while none serves it). The
// claim is read from JetStream when this replica has not seen it yet. It
// returns an error wrapping [ErrNotFound] when no team owns name, and
// other errors when the registry cannot be read.
func (d *Dispatcher) Function(ctx context.Context, name string) (*FunctionStatus, error) {
	if err := protocol.ValidateFunctionName(name); err != nil {
		return nil, fmt.Errorf("%w: function %q: %v", ErrNotFound, name, err)
	}
	f, err := d.registry.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	if f == nil {
		return nil, fmt.Errorf("%w: function %q", ErrNotFound, name)
	}
	claim, _ := d.registry.claimOf(name)
	if claim == nil { // withdrawn since the lookup
		claim = &protocol.FunctionSpec{Name: name, Team: f.team}
	}
	st := &FunctionStatus{Spec: claim, Accepted: claim}
	schemas := map[string]bool{}
	for i, l := range f.live {
		if i == 0 {
			spec := l.decl.Spec
			st.Spec = &spec
		}
		schemas[l.digest] = true
		st.Executors = append(st.Executors, ExecutorStatus{Executor: l.decl.Executor, Instance: l.decl.Instance,
			StartedAt: l.decl.StartedAt, Schema: l.digest})
	}
	st.Schemas = len(schemas)
	return st, nil
}

// CheckOutput checks the output of a call of the function spec describes
// against its OutputSchema and returns what is wrong with it, or "" if
// nothing is (or it declares none). An output with a schema must be a
// JSON object that matches it.
func (d *Dispatcher) CheckOutput(spec *protocol.FunctionSpec, output []byte) string {
	if len(spec.OutputSchema) == 0 {
		return ""
	}
	s, err := d.registry.compiledOutput(spec, false)
	if err != nil {
		return fmt.Sprintf("its declared output schema does not compile: %v", err)
	}
	if o := bytes.TrimSpace(output); len(o) == 0 || o[0] != '{' {
		return "the output is not a JSON object, as its declared output schema requires"
	}
	if v := s.Violations(output); v != "" {
		return "the output does not match its declared output schema: " + v
	}
	return ""
}
