package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/internal/demo"
)

// devCmd runs a team's local loop: embedded JetStream, the platform
// simulator playing the team's scenarios, a dispatcher and executors for
// the team's functions file, reloaded when the files change.
func devCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher dev", flag.ContinueOnError)
	fs.SetOutput(stderr)
	config := fs.String("config", "", "the team's functions file, as executor -config takes it (required)")
	scenarios := fs.String("scenarios", "", "scenarios for the simulator's model (see testdata/scenarios.yaml); default: one per function, arguments made up from its schema")
	addr := fs.String("addr", "127.0.0.1:8080", "the dispatcher's HTTP API (/v1, /mcp) and POST /dev/play")
	natsListen := fs.String("nats-listen", "127.0.0.1:4222", "client address of the embedded JetStream server")
	timeout := fs.Duration("timeout", 60*time.Second, "give up on a scenario after this long")
	verbose := fs.Bool("v", false, "log warnings and errors to stderr")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher dev -config functions.yaml [-scenarios scenarios.yaml] [flags]\n\n"+
			"Runs everything on this machine: an embedded JetStream server (temporary data), the platform\n"+
			"simulator, a dispatcher and executors for the functions file. Plays each scenario once the\n"+
			"functions are served, and again when either file changes (a change that is not valid is printed\n"+
			"and the last good version keeps running) or on POST /dev/play (?scenario=NAME for one).\n"+
			"Stops on SIGINT or SIGTERM.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *config == "" || fs.NArg() > 0 {
		fs.Usage()
		return errors.New("dev needs -config functions.yaml")
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = cliutil.Logger(stderr, "warn")
	}
	return demo.RunDev(ctx, demo.DevOptions{
		Out: stdout, Logger: logger, FunctionsFile: *config, ScenariosFile: *scenarios,
		HTTPAddr: *addr, NATSListen: *natsListen, Timeout: *timeout, TraceURL: os.Getenv("TOOLRELAY_TRACE_URL"),
	})
}
