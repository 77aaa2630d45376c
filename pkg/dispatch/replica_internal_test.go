package dispatch

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// replica starts a dispatcher named name on js, on a platform whose
// responses never finish.
func replica(t testing.TB, js jetstream.JetStream, name string) *Dispatcher {
	t.Helper()
	return replicaOn(t, js, name, idlePlatform{})
}

// replicaOn is replica on platform p, with tune applied before it runs.
func replicaOn(t testing.TB, js jetstream.JetStream, name string, p Platform, tune ...func(*Dispatcher)) *Dispatcher {
	t.Helper()
	d, err := New(js, []Platform{p}, Options{Name: name, Logger: testutil.Logger(t), PollInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range tune {
		f(d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = d.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 30*time.Second, "replica "+name+" to be ready", d.Ready)
	return d
}

// A lease past its expiry here, with no renewal heard and no marker from
// the server yet (a watcher stalled while a server fails over), has
// lapsed lately for one lease period, then not any more; a current lease
// has not lapsed.
func TestALeasePastItsExpiryHasLapsedLately(t *testing.T) {
	r := newRegistry(testutil.Logger(t))
	lease := func(team string, expired time.Duration) {
		r.live["get_weather"] = map[string]*declared{"k": {expires: time.Now().Add(-expired),
			decl: &protocol.Declaration{Spec: protocol.FunctionSpec{Name: "get_weather", Team: team}}}}
	}
	for _, c := range []struct {
		team    string
		expired time.Duration
		want    bool
	}{
		{"geo", -time.Second, false},
		{"geo", time.Second, true},
		{"geo", protocol.LeaseTTL + time.Second, false},
		{"other", time.Second, false},
	} {
		lease(c.team, c.expired)
		if got := r.lapsedLately("get_weather", "geo"); got != c.want {
			t.Errorf("a lease of team %s expired %s ago: lapsed lately = %v, want %v", c.team, c.expired, got, c.want)
		}
	}
}
