package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"syscall"
	"time"
)

// A fault is one thing that goes wrong, and how long until it is repaired.
type faultKind string

const (
	killDispatcher  faultKind = "kill -9 dispatcher"
	termDispatcher  faultKind = "SIGTERM dispatcher (restart)"
	rollDispatchers faultKind = "rolling restart of every dispatcher (SIGTERM, one by one)"
	killExecutor    faultKind = "kill -9 executor"
	termExecutor    faultKind = "SIGTERM executor (restart)"
	stallExecutor   faultKind = "SIGSTOP executor past its ack wait"
	killNode        faultKind = "kill -9 NATS node (restart from its store)"
	platformLimited faultKind = "platform answers 429"
	platformDown    faultKind = "platform answers 500"
)

var faultKinds = []faultKind{killDispatcher, termDispatcher, rollDispatchers, killExecutor, termExecutor, stallExecutor, killNode, platformLimited, platformDown}

// faultRecord is one injected fault, for the report.
type faultRecord struct {
	kind   faultKind
	target string
	at     time.Duration // since the load started
	end    time.Duration // when it was repaired
	// stopTook is how long the process took to exit (SIGTERM: within its
	// shutdown timeout, exit 0 expected); recovered how long until it (or
	// the platform) served again.
	stopTook, recovered time.Duration
	cleanExit           bool
	err                 error
}

// injectFaults injects faults one after another until ctx ends, each
// repaired before the next, waiting an exponential time with the given
// mean between them.
func (f *fleet) injectFaults(ctx context.Context, rng *rand.Rand, mean time.Duration) []faultRecord {
	start := time.Now()
	var out []faultRecord
	for {
		wait := time.Duration(rng.ExpFloat64() * float64(mean))
		select {
		case <-ctx.Done():
			return out
		case <-time.After(wait):
		}
		kind := faultKinds[rng.IntN(len(faultKinds))]
		rec := faultRecord{kind: kind, at: time.Since(start)}
		f.inject(context.WithoutCancel(ctx), rng, &rec)
		rec.end = time.Since(start)
		fmt.Printf("chaos: %6.1fs %-44s %-22s stop %-8s back after %s%s\n", rec.at.Seconds(), rec.kind, rec.target,
			rec.stopTook.Round(time.Millisecond), rec.recovered.Round(time.Millisecond), errText(rec.err))
		out = append(out, rec)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return " ERROR: " + err.Error()
}

func (f *fleet) inject(ctx context.Context, rng *rand.Rand, rec *faultRecord) {
	pick := func(ps []*proc) *proc { return ps[rng.IntN(len(ps))] }
	down := time.Duration(1+rng.IntN(3)) * time.Second
	restart := func(p *proc, sig syscall.Signal) {
		rec.target = p.name
		exited, took := p.signal(sig, 20*time.Second)
		rec.stopTook = took
		rec.cleanExit = exited && p.exitCode() == 0
		if sig == syscall.SIGTERM && !rec.cleanExit {
			rec.err = fmt.Errorf("%s did not exit 0 on SIGTERM within 20s (exit %d)", p.name, p.exitCode())
		}
		time.Sleep(down) // the outage itself
		back, err := p.restart(ctx)
		rec.recovered, rec.err = back, errors.Join(rec.err, err) // an unclean exit is not masked by a good restart
	}
	switch rec.kind {
	case killDispatcher:
		restart(pick(f.dispatchers), syscall.SIGKILL)
	case termDispatcher:
		restart(pick(f.dispatchers), syscall.SIGTERM)
	case rollDispatchers:
		// As a deploy does: each replica stopped and back before the next.
		var stop, back time.Duration
		for _, d := range f.dispatchers {
			restart(d, syscall.SIGTERM)
			stop, back = stop+rec.stopTook, back+rec.recovered
			if rec.err != nil {
				break
			}
		}
		rec.target, rec.stopTook, rec.recovered = "every dispatcher", stop, back
	case killExecutor:
		restart(pick(f.executors), syscall.SIGKILL)
	case termExecutor:
		restart(pick(f.executors), syscall.SIGTERM)
	case killNode:
		restart(pick(f.nodes), syscall.SIGKILL)
	case stallExecutor:
		p := pick(f.executors)
		rec.target = p.name
		p.signal(syscall.SIGSTOP, 0)
		time.Sleep(ackWait + 2*time.Second)
		p.signal(syscall.SIGCONT, 0)
	case platformLimited, platformDown:
		rec.target = "platform"
		mode := platform429
		if rec.kind == platformDown {
			mode = platform500
		}
		f.platform.set(mode)
		time.Sleep(2 * down)
		f.platform.set(platformOK)
	}
}

func (p *proc) exitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.ProcessState == nil {
		return -1
	}
	return p.cmd.ProcessState.ExitCode()
}
