package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// curveTime: toolrelay at a sustained rate of single-call turns, sampled
// as time passes: what the server holds in memory and on disk.
func curveTime(ctx context.Context, cfg config, c *curve) error {
	rate, duration, every := 1000, 2*time.Minute, 15*time.Second
	if cfg.quick {
		rate, duration, every = 300, 8*time.Second, 4*time.Second
	}
	c.title, c.size, c.yLabel = fmt.Sprintf("Time at a sustained rate (%d calls/s)", rate), "seconds", "MiB"
	c.cols = []column{
		{"calls done", false}, {"server heap (MiB)", true}, {"server RSS (MiB)", true},
		{"turn records (MiB)", true}, {"timers (MiB)", true}, {"results (MiB)", true}, {"calls (MiB)", false}, {"other streams (MiB)", false},
		{"stored messages", false},
	}
	srv, env, stopServer, err := freshServer(ctx, "time")
	if err != nil {
		return err
	}
	defer stopServer()

	// The server's cost of a message ID in a duplicates window, from a
	// stream of its own: the same messages with and without IDs.
	perID, perSubject, err := serverCosts(ctx, srv, env, min(rate*int(duration.Seconds()), 100000))
	if err != nil {
		return err
	}

	s, err := newStack(ctx, env, 1, noop)
	if err != nil {
		return err
	}
	defer s.stop()
	_, js, err := env.connect("curves-check")
	if err != nil {
		return err
	}
	defer js.Conn().Close()
	_, heap0, err := srv.mem()
	if err != nil {
		return err
	}
	sample := func(at time.Duration) (map[string]jetstream.StreamState, error) {
		rss, heap, err := srv.mem()
		if err != nil {
			return nil, err
		}
		st, err := streamStates(ctx, js)
		if err != nil {
			return nil, err
		}
		var turns, timers, results, calls, other, msgs float64
		for name, s := range st {
			mib := float64(s.Bytes) / (1 << 20)
			msgs += float64(s.Msgs)
			switch {
			case name == "KV_toolrelay_turns":
				turns += mib
			case name == "FNTIMERS":
				timers += mib
			case strings.HasPrefix(name, "FNRESULTS_"):
				results += mib
			case strings.HasPrefix(name, "FNCALLS_"):
				calls += mib
			default:
				other += mib
			}
		}
		c.add(at.Seconds(), "", float64(s.sink.count.Load()), float64(heap)/(1<<20), float64(rss)/(1<<20),
			turns, timers, results, calls, other, msgs)
		return st, nil
	}
	if _, err := sample(0); err != nil {
		return err
	}
	var last map[string]jetstream.StreamState
	if err := offer(ctx, s, rate, duration, every, func(at time.Duration) (err error) {
		last, err = sample(at)
		return err
	}); err != nil {
		return err
	}
	if n := s.sink.failed.Load(); n > 0 {
		return fmt.Errorf("%d calls failed: %s", n, *s.sink.why.Load())
	}
	done := float64(s.sink.count.Load())
	_, heap1, err := srv.mem()
	if err != nil {
		return err
	}
	var per []string
	names := make([]string, 0, len(last))
	for n := range last {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if st := last[n]; st.Msgs > 0 {
			per = append(per, fmt.Sprintf("%s %.0f B and %.2f messages", n, float64(st.Bytes)/done, float64(st.Msgs)/done))
		}
	}
	c.note("Offered %d single-call turns/s for %s (open loop, no-op function, one executor, one dispatcher; the server in a process "+
		"of its own, its heap after a GC). Per call taken in, the streams held at the end: %s.", rate, duration, strings.Join(per, "; "))
	c.note("The server's heap grew %.0f B per call over the run. Measured in the same run on streams of %d messages of their own: "+
		"a message ID held in a duplicates window costs the server %.0f B of heap, and a subject of its own (which every turn record "+
		"and every result has, for as long as they are kept) %.0f B. A call holds two IDs, its call's in its team's call stream for "+
		"protocol.CallDuplicateWindow (2 min, 15 in streams created before it) and its result's for protocol.ResultDuplicateWindow (2 min), and two subjects "+
		"until 10 minutes past its run's expiry (20 minutes after intake at the default 10-minute run TTL; an MCP task's an hour after its start): "+
		"its closed turn record's (KV_toolrelay_turns, by the Nats-TTL of the write that closes it) and its result's (FNRESULTS_<team>, by its Nats-TTL, "+
		"keep_result_until). The run is shorter than that, so nothing expires within it: what a call leaves is read from the bytes per call above.",
		(float64(heap1)-float64(heap0))/done, min(rate*int(duration.Seconds()), 100000), perID, perSubject)
	return nil
}

// streamStates reads the state of every stream.
func streamStates(ctx context.Context, js jetstream.JetStream) (map[string]jetstream.StreamState, error) {
	out := map[string]jetstream.StreamState{}
	l := js.ListStreams(ctx)
	for info := range l.Info() {
		out[info.Config.Name] = info.State
	}
	return out, l.Err()
}

// serverCosts measures the server heap a message ID held in a duplicates
// window takes, and a subject of its own: n messages published with IDs
// into a stream with a 15-minute window, and n each on a subject of its
// own, against n without either.
func serverCosts(ctx context.Context, srv *child, env *natsEnv, n int) (perID, perSubject float64, err error) {
	_, js, err := env.connect("curves-dedupe")
	if err != nil {
		return 0, 0, err
	}
	defer js.Conn().Close()
	heapGrowth := func(name string, ids, subjects bool) (float64, error) {
		st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.FileStorage,
			Duplicates: 15 * time.Minute})
		if err != nil {
			return 0, err
		}
		_, h0, err := srv.mem()
		if err != nil {
			return 0, err
		}
		for i := range n {
			key := fmt.Sprintf("891ba37957aad57674e84d4889f5b53a.%016x", i)
			m := nats.NewMsg(name + ".x")
			if subjects {
				m.Subject = name + "." + key
			}
			m.Data = payload
			if ids {
				m.Header.Set(nats.MsgIdHdr, key)
			}
			_, err := js.PublishMsgAsync(m)
			for errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
				// A loaded host acknowledges slower than the client's
				// stall wait: let what is in flight land, and go on.
				select {
				case <-js.PublishAsyncComplete():
				case <-ctx.Done():
					return 0, ctx.Err()
				}
				_, err = js.PublishMsgAsync(m)
			}
			if err != nil {
				return 0, err
			}
		}
		select {
		case <-js.PublishAsyncComplete():
		case <-ctx.Done():
			return 0, ctx.Err()
		}
		_, h1, err := srv.mem()
		if err != nil {
			return 0, err
		}
		if err := js.DeleteStream(ctx, st.CachedInfo().Config.Name); err != nil {
			return 0, err
		}
		return float64(h1) - float64(h0), nil
	}
	plain, err := heapGrowth("BENCHPLAIN", false, false)
	if err != nil {
		return 0, 0, err
	}
	withIDs, err := heapGrowth("BENCHIDS", true, false)
	if err != nil {
		return 0, 0, err
	}
	withSubjects, err := heapGrowth("BENCHSUBJECTS", false, true)
	if err != nil {
		return 0, 0, err
	}
	return (withIDs - plain) / float64(n), (withSubjects - plain) / float64(n), nil
}

// curveResultsFull: a team whose result stream fills. Results stay until
// their call's keep_result_until (10 minutes past the run's expiry), and a
// full result stream refuses new ones (Discard: new): a team whose rate
// times that time times a result's size passes its stream's MaxBytes
// (TOOLRELAY_TEAM_RESULT_BYTES) stops completing calls. Here the stream
// is small enough to fill within the run.
func curveResultsFull(ctx context.Context, cfg config, c *curve) error {
	rate, maxBytes, duration, every := 300, int64(4<<20), 40*time.Second, 5*time.Second
	if cfg.quick {
		maxBytes, duration, every = 1<<20, 8*time.Second, 2*time.Second
	}
	c.title, c.size, c.yLabel = fmt.Sprintf("A team's result stream filling (%d calls/s into %d MiB)", rate, maxBytes>>20), "seconds", "MiB"
	c.cols = []column{{"calls done", false}, {"results stored (MiB)", true}, {"calls waiting (MiB)", true}}
	_, env, done, err := freshServer(ctx, "results")
	if err != nil {
		return err
	}
	defer done()
	_, js, err := env.connect("curves-check")
	if err != nil {
		return err
	}
	defer js.Conn().Close()
	// The executor logs each refused result: what is measured is the count.
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(slog.New(slog.DiscardHandler))
	// Made before the executor starts, which would make it at the default size.
	if _, err := provision.Stream(ctx, js, provision.ResultStreamConfig(benchTeam, maxBytes, provision.Options{})); err != nil {
		return err
	}
	// Its calls cannot record their results: the executor need not wait
	// for them when it stops.
	s, err := newStack(ctx, env, 1, noop, stackOptions{resultBytes: maxBytes, execShutdown: time.Second})
	if err != nil {
		return err
	}
	defer s.stop()
	err = offer(ctx, s, rate, duration, every, func(at time.Duration) error {
		st, err := streamStates(ctx, js)
		if err != nil {
			return err
		}
		c.add(at.Seconds(), "", float64(s.sink.count.Load()), float64(st[protocol.ResultStream(benchTeam)].Bytes)/(1<<20),
			float64(st[protocol.CallStream(benchTeam)].Bytes)/(1<<20))
		return nil
	})
	c.note("Once the stream holds %d MiB of results, every further result is refused (10077, maximum bytes exceeded): executors "+
		"log \"could not record result; call will be redelivered\", calls stay in their queue, and no turn of the team closes until "+
		"its deadline cuts it off. A result is kept until 10 minutes past its run's expiry (its Nats-TTL): 20 minutes after intake "+
		"at the default 10-minute run TTL. At the default 256 MiB and about 650 B a result, a team reaches that after some 413,000 calls "+
		"within 20 minutes: at a sustained rate above about 340 calls/s of such turns (59 calls/s when results were kept 2 hours).", maxBytes>>20)
	return err
}

// offer takes in rate single-call turns of noop a second into s for
// duration, open loop, and calls sample every so often.
func offer(ctx context.Context, s *stack, rate int, duration, every time.Duration, sample func(time.Duration) error) error {
	start := time.Now()
	offered := 0
	sem := make(chan struct{}, 2048)
	var wg sync.WaitGroup
	defer wg.Wait()
	var failed error
	var mu sync.Mutex
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	next := every
	for time.Since(start) < duration {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		mu.Lock()
		err := failed
		mu.Unlock()
		if err != nil {
			return err
		}
		for due := int(time.Since(start).Seconds() * float64(rate)); offered < due; offered++ {
			select {
			case sem <- struct{}{}:
			default:
				return fmt.Errorf("toolrelay fell behind the offered %d calls/s (%d calls failed)", rate, s.sink.failed.Load())
			}
			wg.Go(func() {
				defer func() { <-sem }()
				if _, err := s.d.Intake(ctx, turn("noop", 1)); err != nil {
					mu.Lock()
					failed = err
					mu.Unlock()
				}
			})
		}
		if el := time.Since(start); el >= next {
			next += every
			if err := sample(el); err != nil {
				return err
			}
		}
	}
	return nil
}
