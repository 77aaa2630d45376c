package dispatch_test

import (
	"testing"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Without a TeamAPIPrefix a team's streams are read on the dispatcher's
// own JetStream; with one, under the team's prefix. A team name that would
// put subject tokens into the prefix, and a prefix without {team}, are
// refused.
func TestTeamJetStream(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	if _, err := dispatch.New(js, nil, dispatch.Options{TeamAPIPrefix: "$JS.teams.API"}); err == nil {
		t.Error("a TeamAPIPrefix without {team} was accepted")
	}
	d, err := dispatch.New(js, nil, dispatch.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if own, err := d.TeamJetStream("orders"); err != nil || own != js {
		t.Errorf("without a prefix: %v, %v; want the dispatcher's own JetStream", own, err)
	}
	d, err = dispatch.New(js, nil, dispatch.Options{TeamAPIPrefix: protocol.TeamAPIPrefixTemplate})
	if err != nil {
		t.Fatal(err)
	}
	orders, err := d.TeamJetStream("orders")
	if err != nil || orders.Options().APIPrefix != "$JS.team.orders.API" {
		t.Fatalf("orders' JetStream: %v; want it under $JS.team.orders.API", err)
	}
	if again, _ := d.TeamJetStream("orders"); again != orders {
		t.Error("a second TeamJetStream of the same team made another JetStream context")
	}
	for _, bad := range []string{"", "a.b", ">", "*", "a b"} {
		if _, err := d.TeamJetStream(bad); err == nil {
			t.Errorf("TeamJetStream(%q) was accepted", bad)
		}
	}
}
