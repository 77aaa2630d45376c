package main

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/internal/demo"
)

func demoCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data", "", "store JetStream data here (default: a temporary directory, removed afterwards)")
	external := fs.Bool("external-executors", false, "do not start executors in-process; run `executor -demo` against the same NATS")
	verbose := fs.Bool("v", false, "log warnings and errors to stderr")
	timeout := fs.Duration("timeout", 60*time.Second, "give up on a scenario after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = cliutil.Logger(stderr, "warn")
	}
	return demo.Run(ctx, demo.Options{
		Out: stdout, Logger: logger, NATSURL: os.Getenv("NATS_URL"), DataDir: *dataDir,
		ExternalExecutors: *external, Timeout: *timeout,
	})
}
