package main

import (
	"context"
	"fmt"
	"os"
	"runtime/metrics"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natsembed"
)

// natsEnv is the JetStream server of one phase: an embedded server with
// file storage in a fresh directory (toolrelay's default), or the server at
// -nats cleared of the streams earlier phases left.
type natsEnv struct {
	url string
	srv *server.Server
	dir string
}

func startNATS(ctx context.Context, cfg config) (*natsEnv, error) {
	if cfg.natsURL != "" {
		e := &natsEnv{url: cfg.natsURL}
		_, js, err := e.connect("bench-cleanup")
		if err != nil {
			return nil, err
		}
		names := js.StreamNames(ctx)
		for n := range names.Name() {
			if strings.HasPrefix(n, "FN") || strings.HasPrefix(n, "KV_toolrelay") || strings.HasPrefix(n, "BENCH") {
				_ = js.DeleteStream(ctx, n)
			}
		}
		js.Conn().Close()
		return e, nil
	}
	dir, err := os.MkdirTemp("", "toolrelay-bench-")
	if err != nil {
		return nil, err
	}
	s, err := natsembed.Start(natsembed.Options{StoreDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &natsEnv{url: s.ClientURL(), srv: s, dir: dir}, nil
}

func (e *natsEnv) connect(name string) (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(e.url, nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, nil, fmt.Errorf("connect %s: %w", e.url, err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

func (e *natsEnv) close() {
	if e.srv != nil {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		os.RemoveAll(e.dir)
	}
}

// latencies summarises closed-loop samples.
type latencies []time.Duration

// closedLoop times call n times, one at a time.
func closedLoop(n int, call func() error) (latencies, error) {
	lat := make(latencies, 0, n)
	for range n {
		t0 := time.Now()
		if err := call(); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(t0))
	}
	return lat, nil
}

func (l latencies) sorted() latencies {
	s := slices.Clone(l)
	slices.Sort(s)
	return s
}

func (l latencies) pct(p float64) time.Duration {
	if len(l) == 0 {
		return 0
	}
	s := l.sorted()
	i := int(p / 100 * float64(len(s)-1))
	return s[i]
}

func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// usf formats a duration in microseconds.
func usf(d time.Duration) string {
	return fmt.Sprintf("%.1f µs", float64(d)/float64(time.Microsecond))
}

// cpuTime is the CPU time this process has used, user and system. The
// pipelines measured run in this process (the embedded server included),
// so its change over a run, per call, is what a call costs the machine:
// unlike a rate, it does not move with what else the machine is doing.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// allocs is what the process's heap took in: objects and bytes.
type allocs struct{ objects, bytes float64 }

var allocSamples = []metrics.Sample{{Name: "/gc/heap/allocs:objects"}, {Name: "/gc/heap/allocs:bytes"}}

// allocated returns what the process has allocated on its heap so far.
func allocated() allocs {
	s := slices.Clone(allocSamples)
	metrics.Read(s)
	return allocs{objects: float64(s[0].Value.Uint64()), bytes: float64(s[1].Value.Uint64())}
}

// per returns what was allocated since a, per one of n.
func (a allocs) per(n int) allocs {
	now := allocated()
	return allocs{objects: (now.objects - a.objects) / float64(n), bytes: (now.bytes - a.bytes) / float64(n)}
}

func (a allocs) String() string {
	return fmt.Sprintf("%.0f objects, %.1f KiB", a.objects, a.bytes/1024)
}

// traffic is what a phase's server has received and sent: messages from
// its clients (publications, acknowledgements, API requests) and to them
// (deliveries, answers). Unlike time, it is the same in every run, and
// tells how many operations a call costs the server.
type traffic struct{ in, out float64 }

// traffic returns what the embedded server has seen so far; nothing for a
// server at -nats, which others may be using.
func (e *natsEnv) traffic() traffic {
	if e.srv == nil {
		return traffic{}
	}
	v, err := e.srv.Varz(nil)
	if err != nil {
		return traffic{}
	}
	return traffic{in: float64(v.InMsgs), out: float64(v.OutMsgs)}
}

// per returns what the server saw since t, per one of n.
func (t traffic) per(e *natsEnv, n int) traffic {
	now := e.traffic()
	return traffic{in: (now.in - t.in) / float64(n), out: (now.out - t.out) / float64(n)}
}

func (t traffic) String() string {
	return fmt.Sprintf("%.2f in, %.2f out", t.in, t.out)
}

// payload mimics a call envelope's size: a few hundred bytes.
var payload = []byte(`{"v":1,"key":"891ba37957aad57674e84d4889f5b53a.e1e1856e112d8be5","platform":"responses","scope":"resp_AiFWKCbrNoE2KGEoYn7ep1Dy","call_id":"call_hTthyt3Sx8AzZZi3qmgYfH1O","team":"bench","function":"noop","arguments":{"order_id":"A-1001","carrier":"ups"},"deadline":"2026-01-01T00:09:30Z","created_at":"2026-01-01T00:00:01Z"}`)
