package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/internal/conformance/kit"
	"github.com/toolrelay/toolrelay/internal/natsembed"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// conformanceCmd runs the protocol conformance kit against an executor:
//
//	dispatcher conformance -team T [-function F,...] [-nats URL] [-exec "command"] [-go]
//
// Without -nats (and NATS_URL) it starts an embedded JetStream server and a
// dispatcher in-process, and gives the executor it starts NATS_URL.
func conformanceCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("conformance", flag.ContinueOnError)
	fs.SetOutput(stderr)
	team := fs.String("team", "", "the executor's team (required)")
	functions := fs.String("function", "", "run only the cases of these test functions (comma-separated; default: all of "+strings.Join(kit.Functions, ", ")+")")
	natsURL := fs.String("nats", os.Getenv("NATS_URL"), "NATS server URL (credentials from NATS_CREDS or NATS_NKEY); empty: start an embedded server and a dispatcher")
	command := fs.String("exec", "", "command line that starts the executor (run by sh -c with NATS_URL and TOOLRELAY_TEAM set); stopped with SIGTERM. Without it the executor must be running already, and the cases that stop it are skipped")
	goRef := fs.Bool("go", false, "serve the test functions in-process on pkg/exec (the reference executor) instead of -exec")
	startDispatcher := fs.Bool("dispatcher", false, "start a dispatcher in-process even with -nats (one always runs with the embedded server)")
	verbose := fs.Bool("v", false, "log the in-process server, dispatcher and executor")
	fs.Usage = func() {
		fmt.Fprint(stderr, "usage: dispatcher conformance -team T [-function F,...] [-nats URL] [-exec \"command\" | -go]\n\n"+
			"Drives an executor through docs/protocol.md and prints PASS/FAIL per case; exits 1 if any fails.\n"+
			"The executor serves the test functions docs/operations.md (Conformance kit) describes.\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *team == "" || fs.NArg() > 0 || (*command != "" && *goRef) {
		fs.Usage()
		return errors.New("conformance: -team is required, and -exec and -go exclude each other")
	}
	logger := slog.New(slog.DiscardHandler)
	if *verbose {
		logger = slog.New(slog.NewTextHandler(stderr, nil))
	}
	url := *natsURL
	if url == "" {
		dir, err := os.MkdirTemp("", "toolrelay-conformance-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := natsembed.Start(natsembed.Options{StoreDir: dir, Logger: logger})
		if err != nil {
			return err
		}
		defer srv.Shutdown()
		url, *startDispatcher = srv.ClientURL(), true
	}
	js, closeNATS, err := connectTo(url, "toolrelay-conformance")
	if err != nil {
		return err
	}
	defer closeNATS()
	if *startDispatcher {
		stop, err := runDispatcher(ctx, url, logger)
		if err != nil {
			return err
		}
		defer stop()
	}

	opts := kit.Options{Team: *team}
	if *functions != "" {
		opts.Functions = strings.Split(*functions, ",")
	}
	var target kit.Target
	switch {
	case *goRef:
		target = &kit.GoTarget{JS: js, Team: *team, Logger: logger}
	case *command != "":
		target = kit.Shell(*command, []string{"NATS_URL=" + url, "TOOLRELAY_TEAM=" + *team}, stderr)
	default:
		target, opts.NoRestart = kit.Running{}, true
	}
	start := time.Now()
	rep, err := kit.Run(ctx, js.Conn(), target, opts, stdout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d passed, %d failed, %d skipped in %s\n", rep.Passed, rep.Failed, rep.Skipped, time.Since(start).Round(time.Millisecond))
	if !rep.OK() {
		return fmt.Errorf("conformance: %d case(s) failed", rep.Failed)
	}
	return nil
}

// runDispatcher runs a dispatcher without platforms on url, for the
// declarations, until stop.
func runDispatcher(ctx context.Context, url string, logger *slog.Logger) (stop func(), err error) {
	js, closeNATS, err := connectTo(url, "toolrelay-conformance-dispatcher")
	if err != nil {
		return nil, err
	}
	d, err := dispatch.New(js, nil, dispatch.Options{Logger: logger})
	if err != nil {
		closeNATS()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- d.Run(rctx) }()
	for !d.Ready() {
		select {
		case err := <-done:
			cancel()
			closeNATS()
			return nil, fmt.Errorf("conformance: dispatcher: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return func() { cancel(); <-done; closeNATS() }, nil
}
