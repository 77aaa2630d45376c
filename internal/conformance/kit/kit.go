package kit

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Target is the executor under test. The kit calls Start before the first
// case, and Stop and Start again for the cases about stopping and
// redeliveries; Start is never called twice without a Stop between.
type Target interface {
	// Start starts serving (for a process: starts it) and returns without
	// waiting for it to declare: the kit waits for the declarations.
	Start(ctx context.Context) error
	// Stop asks the executor to stop as SIGTERM would, and waits until it
	// has. It returns an error if it did not stop cleanly (for a process:
	// exited non-zero or had to be killed).
	Stop(ctx context.Context) error
}

// Options configure a run of the kit. The zero value is valid but for Team.
type Options struct {
	// Team is the executor's team. Required.
	Team string
	// Functions restricts the run to the cases of these test functions
	// (and the declaration case). Default: all of Functions.
	Functions []string
	// NoRestart skips the cases that stop and start the target (stop and
	// hand-back, a redelivery after a recorded result, may_have_run), for
	// an executor the kit cannot restart.
	NoRestart bool
	// DeclareTimeout bounds the wait for the executor's declarations.
	// Default: 30s.
	DeclareTimeout time.Duration
}

// Report is the outcome of a run.
type Report struct {
	Passed, Failed, Skipped int
}

// OK reports whether no case failed.
func (r Report) OK() bool { return r.Failed == 0 }

// Run drives target through the cases on nc, printing one line per case to
// out, and returns the counts. It returns an error only when it could not
// run at all (the target would not start, or nc has no JetStream).
func Run(ctx context.Context, nc *nats.Conn, target Target, opts Options, out io.Writer) (Report, error) {
	if err := protocol.ValidateTeamName(opts.Team); err != nil {
		return Report{}, fmt.Errorf("conformance: %w", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return Report{}, fmt.Errorf("conformance: %w", err)
	}
	if opts.DeclareTimeout <= 0 {
		opts.DeclareTimeout = 30 * time.Second
	}
	k := &kit{nc: nc, js: js, team: opts.Team, target: target, opts: opts, out: out}
	if err := target.Start(ctx); err != nil {
		return Report{}, fmt.Errorf("conformance: start the executor: %w", err)
	}
	k.running = true
	defer func() {
		if k.running {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
			defer cancel()
			_ = target.Stop(sctx)
		}
	}()
	for _, c := range cases {
		if ctx.Err() != nil {
			break
		}
		k.run(ctx, c)
	}
	return k.report, nil
}

// kit is one run.
type kit struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	team    string
	target  Target
	opts    Options
	out     io.Writer
	report  Report
	running bool
	// declared maps each test function to its live declarations' specs,
	// once the declaration case has seen them.
	declared map[string]*protocol.Declaration
	// failedKey is the call the handler-error case dead-lettered, for the
	// replay case.
	failedKey protocol.CallKey
	restart   restartState
}

// testCase is one line of the report.
type testCase struct {
	name string
	// fn is the test function the case needs ("" for none).
	fn string
	// restarts: the case stops and starts the target.
	restarts bool
	// check returns "" when the executor did as the protocol says, or what
	// was expected and what was seen.
	check func(k *kit, ctx context.Context) string
}

func (k *kit) run(ctx context.Context, c testCase) {
	if c.fn != "" && len(k.opts.Functions) > 0 && !slices.Contains(k.opts.Functions, c.fn) {
		return
	}
	if c.restarts && k.opts.NoRestart {
		k.report.Skipped++
		fmt.Fprintf(k.out, "SKIP %s: the executor cannot be restarted\n", c.name)
		return
	}
	if c.fn != "" && k.declared != nil && k.declared[c.fn] == nil {
		k.report.Failed++
		fmt.Fprintf(k.out, "FAIL %s: expected %s to be declared, saw no declaration\n", c.name, c.fn)
		return
	}
	start := time.Now()
	problem := c.check(k, ctx)
	took := time.Since(start).Round(time.Millisecond)
	if problem == "" {
		k.report.Passed++
		fmt.Fprintf(k.out, "PASS %s (%s)\n", c.name, took)
		return
	}
	k.report.Failed++
	fmt.Fprintf(k.out, "FAIL %s (%s): %s\n", c.name, took, strings.TrimSpace(problem))
}
