package natsdeploy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// declareFloodBound is how much slower than its baseline billing's
// slowest renewal may be while orders floods: ten times, plus half a second
// for a loaded machine. The lease of a declaration is 15 s; before each
// team had its own queue the flood held billing's renewal for 34 s.
func declareFloodBound(baseline time.Duration) time.Duration {
	return 10*baseline + 500*time.Millisecond
}

// TestADeclarationFloodLeavesOtherTeamsAlone is issue 39's declaration
// flood on the generated configuration: orders sends 300 requests of 256
// declarations each in 5 s, without waiting for answers, while billing
// renews a declaration and plays turns. Billing's turns complete with its
// answer, and its renewals keep within declareFloodBound of their
// baseline measured before the flood.
func TestADeclarationFloodLeavesOtherTeamsAlone(t *testing.T) {
	x := deploy(t)
	x.victimCompletes()
	bnc, _ := x.connect("billing")
	onc, _ := x.connect("orders")

	probe := declareBody(t, "billing", "probe", "get_probe")
	renew := func() (time.Duration, error) {
		start := time.Now()
		m, err := bnc.Request(protocol.DeclareSubject("billing"), probe, 20*time.Second)
		if err != nil {
			return 0, err
		}
		r, err := protocol.DecodeDeclareReply(m.Data)
		if err == nil && (r.Error != "" || len(r.Accepted) != 1) {
			err = fmt.Errorf("reply %+v", r)
		}
		return time.Since(start), err
	}
	var baseline time.Duration
	for range 5 {
		d, err := renew()
		if err != nil {
			t.Fatalf("billing's renewal before the flood: %v", err)
		}
		baseline = max(baseline, d)
	}

	// Orders' answers go to an inbox it does not wait on.
	var busy sync.Map
	inbox := onc.NewRespInbox()
	sub, err := onc.Subscribe(inbox, func(m *nats.Msg) {
		r, err := protocol.DecodeDeclareReply(m.Data)
		if err == nil && strings.Contains(r.Error, "dispatcher busy") {
			busy.Store(time.Now().UnixNano(), true)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	flood := make([][]byte, 8)
	for i := range flood {
		names := make([]string, protocol.MaxDeclarations)
		for j := range names {
			names[j] = fmt.Sprintf("flood_%d_%d", i, j)
		}
		flood[i] = declareBody(t, "orders", fmt.Sprintf("flood%d", i), names...)
	}
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := range 300 {
			if err := onc.PublishRequest(protocol.DeclareSubject("orders"), inbox, flood[i%len(flood)]); err != nil {
				t.Error(err)
				return
			}
			if i%3 == 2 { // 60 a second
				<-tick.C
			}
		}
	}()

	var during []time.Duration
	turns := make(chan error, 1)
	go func() {
		var err error
		for range 3 {
			var w *dispatch.Watch
			if w, err = x.play(); err == nil && (w.State != dispatch.WatchCompleted || w.Answer != "Your horoscope: "+secretOutput) {
				err = fmt.Errorf("watch %s %q %s", w.State, w.Answer, w.Error)
			}
			if err != nil {
				break
			}
		}
		turns <- err
	}()
	for flooding := true; flooding; {
		select {
		case <-floodDone:
			flooding = false
		default:
		}
		d, err := renew()
		if err != nil {
			t.Fatalf("billing's renewal during the flood: %v", err)
		}
		during = append(during, d)
	}
	if err := <-turns; err != nil {
		t.Errorf("billing's turns during the flood: %v", err)
	}
	nBusy := 0
	busy.Range(func(any, any) bool { nBusy++; return true })
	slowest, bound := slices.Max(during), declareFloodBound(baseline)
	t.Logf("billing's renewal: baseline %v, during orders' flood of 300 requests x %d declarations slowest %v of %d (bound %v); orders' requests answered busy: %d",
		baseline, protocol.MaxDeclarations, slowest, len(during), bound, nBusy)
	if slowest > bound {
		t.Errorf("billing's slowest renewal during the flood took %v, over the bound %v", slowest, bound)
	}
	x.victimCompletes()
}

// declareBody is a DeclareRequest of team's instance serving names.
func declareBody(t *testing.T, team, instance string, names ...string) []byte {
	t.Helper()
	req := protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareServe}
	for _, n := range names {
		req.Declarations = append(req.Declarations, protocol.Declaration{Version: protocol.Version, Instance: instance,
			Executor: team + "-attack-test", StartedAt: time.Now(), Spec: protocol.FunctionSpec{Version: protocol.Version,
				Name: n, Team: team, Parameters: json.RawMessage(`{"type":"object"}`), UpdatedAt: time.Now()}})
	}
	body, err := protocol.EncodeDeclareRequest(team, &req)
	if err != nil {
		t.Fatal(err)
	}
	return body
}
