package natsdeploy

import (
	"encoding/json"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/schema/schematest"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// TestSchemaAttacksLeaveOtherTeamsAlone makes issue 39's "schemas as
// weapons" attacks as team orders, on its own declare subject and bypassing
// the executor library's checks as a hostile executor would: items nested
// 2,600 deep, a multipleOf of 900k digits (and one of 60k, within the size
// bound), and an anyOf/$ref chain of 19. Each is refused with a reason
// naming the bound, and none reaches the registry.
//
// Billing's turns are timed before the attack (the baseline) and each as
// one round of the attacks is made: each turn during the attacks must take
// at most twice the slowest baseline turn plus 250 ms. (A flood of
// declarations is issue 39's item 2, per-team fairness, not this test's.) Before the bounds, the
// dispatcher compiled the nested schema for 29 s holding the registry's
// lock, which every call waits for.
func TestSchemaAttacksLeaveOtherTeamsAlone(t *testing.T) {
	x := deploy(t)
	onc, _ := x.connect("orders")
	attacks := []struct {
		name, bound string
		schema      []byte
	}{
		{"nested_items", "(MaxDepth)", schematest.NestedItems(2600)},
		{"huge_multiple", "(MaxSize)", schematest.HugeMultipleOf(900_000)},
		{"long_multiple", "(MaxNumberDigits)", schematest.HugeMultipleOf(60_000)},
		{"ref_chain", "(MaxSteps)", schematest.RefChain(19)},
	}
	req := protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareServe}
	for _, a := range attacks {
		req.Declarations = append(req.Declarations, protocol.Declaration{Version: protocol.Version, Instance: "i1", Executor: "orders-exec",
			StartedAt: time.Now(), Spec: protocol.FunctionSpec{Version: protocol.Version, Name: a.name, Team: "orders",
				Description: "An attack.", Parameters: json.RawMessage(a.schema), UpdatedAt: time.Now()}})
	}
	body, err := json.Marshal(&req)
	if err != nil {
		t.Fatal(err)
	}
	declare := func() (*protocol.DeclareReply, error) {
		m, err := onc.Request(protocol.DeclareSubject("orders"), body, 10*time.Second)
		if err != nil {
			return nil, err
		}
		return protocol.DecodeDeclareReply(m.Data)
	}

	timeTurns := func(n int) []time.Duration {
		var took []time.Duration
		for range n {
			start := time.Now()
			x.victimCompletes()
			took = append(took, time.Since(start))
		}
		return took
	}
	baseline := timeTurns(5)
	bound := 2*slices.Max(baseline) + 250*time.Millisecond

	// Each of billing's turns starts as one round of the attacks is sent,
	// as in the issue, where one declaration stalled billing's calls.
	var during []time.Duration
	for range 5 {
		var wg sync.WaitGroup
		var reply *protocol.DeclareReply
		var attackErr error
		startAttack := time.Now()
		wg.Go(func() { reply, attackErr = declare(); t.Logf("attack round answered in %v", time.Since(startAttack)) })
		during = append(during, timeTurns(1)...)
		wg.Wait()
		if attackErr == nil && (reply.Error != "" || len(reply.Accepted) > 0) {
			attackErr = &replyError{reply}
		}
		if attackErr != nil {
			t.Fatalf("an attack was not refused outright: %v", attackErr)
		}
	}
	t.Logf("billing's turns: baseline %v; during the attacks %v; bound %v", baseline, during, bound)
	for i, d := range during {
		if d > bound {
			t.Errorf("billing's turn %d during the attacks took %v, over the bound of %v (twice the slowest of the baseline %v, plus 250 ms)", i, d, bound, baseline)
		}
	}

	reply, err := declare()
	if err != nil {
		t.Fatal(err)
	}
	if len(reply.Refused) != len(attacks) {
		t.Fatalf("reply %+v: want all %d refused", reply, len(attacks))
	}
	for i, a := range attacks {
		if r := reply.Refused[i]; r.Function != a.name || !strings.Contains(r.Reason, a.bound) || r.Owner != "" {
			t.Errorf("refusal of %s: %+v, want one naming %s", a.name, r, a.bound)
		}
	}
	fns, err := dispatch.Registry(t.Context(), x.djs)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fns {
		if f.Spec.Team == "orders" {
			t.Errorf("the registry holds orders' %s: a refused declaration claims no name", f.Spec.Name)
		}
	}
}

type replyError struct{ reply *protocol.DeclareReply }

func (e *replyError) Error() string {
	b, _ := json.Marshal(e.reply)
	return "declare reply " + string(b)
}
