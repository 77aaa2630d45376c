package dispatch_test

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// lastTTL is the Nats-TTL of the last message on subject of stream ("" for
// none); found is false when there is no message.
func lastTTL(t *testing.T, js jetstream.JetStream, stream, subject string) (ttl time.Duration, found bool) {
	t.Helper()
	s, err := js.Stream(t.Context(), stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(t.Context(), subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	h := m.Header.Get(jetstream.MsgTTLHeader)
	if h == "" {
		return 0, true
	}
	if ttl, err = time.ParseDuration(h); err != nil {
		t.Fatalf("%s on %s: %v", jetstream.MsgTTLHeader, subject, err)
	}
	return ttl, true
}

// within fails unless got is in [lo, hi].
func within(t *testing.T, what string, got, lo, hi time.Duration) {
	t.Helper()
	if got < lo || got > hi {
		t.Errorf("%s = %s, want between %s and %s", what, got, lo, hi)
	}
}

// A closed turn's record and its results are kept minutes past the run's
// expiry (a started call's an hour past its start), by their Nats-TTL; an
// open turn's record carries none and keeps the bucket's TTL.
func TestClosedTurnsAndResultsCarryTheirTTL(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.register("geo", "get_weather", weatherSchema)
	seen := make(chan *protocol.Call, 4)
	e.serve("geo", []string{"get_weather"}, func(c *protocol.Call) (string, bool) {
		seen <- c
		if string(c.Arguments) == `{"location":"nowhere"}` {
			return "", false // never answers
		}
		return "sunny", false
	})
	d, _ := e.dispatcher(dispatch.Options{})
	turns := "KV_" + provision.TurnBucket
	record := func(turn protocol.TurnKey) string { return "$KV." + provision.TurnBucket + "." + string(turn) }

	t.Run("direct call", func(t *testing.T) {
		timeout := time.Minute
		start := time.Now()
		res, err := d.Call(t.Context(), dispatch.DirectCall{Function: "get_weather", Arguments: json.RawMessage(`{"location":"Paris"}`), Timeout: timeout})
		if err != nil || !res.OK() {
			t.Fatalf("call: %v %+v", err, res)
		}
		c := <-seen
		// The run expires 5 s after the deadline; both go 10 minutes later.
		keep := c.Deadline.Add(5*time.Second + 10*time.Minute)
		if !c.KeepResultUntil.Equal(keep) {
			t.Errorf("keep_result_until = %s, want the run's expiry + 10m, %s", c.KeepResultUntil, keep)
		}
		elapsed := time.Since(start)
		want := time.Until(keep)
		ttl, found := lastTTL(t, e.js, protocol.ResultStream("geo"), c.ResultSubject())
		if !found {
			t.Fatal("no result recorded")
		}
		within(t, "the result's TTL", ttl, want, want+elapsed+time.Second)
		testutil.WaitForWhat(t, 5*time.Second, "the turn's closing write", func() bool {
			ttl, _ = lastTTL(t, e.js, turns, record(c.Key.Turn()))
			return ttl > 0
		})
		within(t, "the closed record's TTL", ttl, want, want+elapsed+time.Second)
	})

	t.Run("started call", func(t *testing.T) {
		start := time.Now()
		started, err := d.StartCall(t.Context(), "client", dispatch.DirectCall{Function: "get_weather", Arguments: json.RawMessage(`{"location":"Oslo"}`), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		c := <-seen
		if _, err := d.StartedCall(t.Context(), "client", started.Key, true); err != nil {
			t.Fatal(err)
		}
		elapsed := time.Since(start)
		want := dispatch.StartedCallTTL - elapsed
		ttl, _ := lastTTL(t, e.js, protocol.ResultStream("geo"), c.ResultSubject())
		within(t, "the result's TTL", ttl, want, dispatch.StartedCallTTL+time.Second)
		testutil.WaitForWhat(t, 5*time.Second, "the turn's closing write", func() bool {
			ttl, _ = lastTTL(t, e.js, turns, record(started.Key))
			return ttl > 0
		})
		within(t, "the closed record's TTL", ttl, want, dispatch.StartedCallTTL+time.Second)
	})

	t.Run("open turn", func(t *testing.T) {
		started, err := d.StartCall(t.Context(), "client", dispatch.DirectCall{Function: "get_weather", Arguments: json.RawMessage(`{"location":"nowhere"}`), Timeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		<-seen
		ttl, found := lastTTL(t, e.js, turns, record(started.Key))
		if !found || ttl != 0 {
			t.Errorf("open record: found %t, Nats-TTL %s; want found, no TTL", found, ttl)
		}
		if _, err := d.CancelStartedCall(t.Context(), "client", started.Key); err != nil {
			t.Fatal(err)
		}
		if ttl, _ = lastTTL(t, e.js, turns, record(started.Key)); ttl < dispatch.StartedCallTTL-time.Minute {
			t.Errorf("the cancelled call's record: Nats-TTL %s, want about %s", ttl, dispatch.StartedCallTTL)
		}
	})
}
