package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// dlqCmd lists and replays dead letters:
//
//	executor dlq list [-team T] [-json]
//	executor dlq replay [-timeout 5m] <call-key>
func dlqCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return errDLQUsage
	}
	var cfg config
	if err := envconfig.Process("", &cfg); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	switch args[0] {
	case "list":
		return dlqList(ctx, cfg, args[1:], stdout, stderr)
	case "replay":
		return dlqReplay(ctx, cfg, args[1:], stdout, stderr)
	}
	return errDLQUsage
}

var errDLQUsage = errors.New("usage: executor dlq list [-team T] [-json] | executor dlq replay [-timeout 5m] <call-key>")

// dlqConnect connects the dlq commands to NATS, once: they are one-shot,
// so they neither wait for the server nor reconnect.
func dlqConnect(cfg config) (jetstream.JetStream, func(), error) {
	auth, err := cliutil.NATSAuth(cfg.NATSNKey, cfg.NATSCreds)
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(cfg.NATSURL, append([]nats.Option{nats.Name("toolrelay-dlq")}, auth...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", cfg.NATSURL, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}

// dlqList prints the dead letters, one a row (or a JSON line).
func dlqList(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("executor dlq list", flag.ContinueOnError)
	fs.SetOutput(stderr)
	team := fs.String("team", "", "only this team's dead letters")
	asJSON := fs.Bool("json", false, "print the records as JSON lines")
	if err := fs.Parse(args); err != nil {
		return err
	}
	js, closeNC, err := dlqConnect(cfg)
	if err != nil {
		return err
	}
	defer closeNC()
	dls, err := exec.NewDeadLetters(js).List(ctx, *team)
	if err != nil {
		return err
	}
	slices.Reverse(dls) // newest first, as the console lists them
	if *asJSON {
		enc := json.NewEncoder(stdout)
		for _, d := range dls {
			if err := enc.Encode(d); err != nil {
				return err
			}
		}
		return nil
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "AT\tCALL KEY\tTEAM\tFUNCTION\tREASON\tATTEMPTS\tREPLAY\tOUTCOME")
	for _, d := range dls {
		outcome := "ok"
		if d.Result.Error != nil {
			outcome = string(d.Result.Error.Code) + ": " + firstLine(d.Result.Error.Message)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", d.At.Format(time.RFC3339), d.Call.Key, d.Call.Team,
			d.Call.Function, d.Reason, d.Attempts, d.Replay, outcome)
	}
	return tw.Flush()
}

// dlqReplay queues one dead letter's call again, with a fresh deadline.
func dlqReplay(ctx context.Context, cfg config, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("executor dlq replay", flag.ContinueOnError)
	fs.SetOutput(stderr)
	timeout := fs.Duration("timeout", exec.DefaultReplayTimeout, "deadline of the replayed call, from now")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errDLQUsage
	}
	key, err := protocol.ParseCallKey(fs.Arg(0))
	if err != nil {
		return err
	}
	js, closeNC, err := dlqConnect(cfg)
	if err != nil {
		return err
	}
	defer closeNC()
	n, err := exec.NewDeadLetters(js).Replay(ctx, key, *timeout)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "replay %d of %s queued; its outcome appears in \"executor dlq list\"\n", n, key)
	return nil
}

// firstLine is msg's first line, whole, for the last column of the table:
// a newline would start a bogus row and a tab a bogus column, so what
// follows the first line is shown as " …" (-json has all of it) and tabs
// become spaces.
func firstLine(msg string) string {
	line, rest, _ := strings.Cut(msg, "\n")
	line = strings.ReplaceAll(strings.TrimRight(line, "\r"), "\t", " ")
	if strings.TrimSpace(rest) != "" {
		line += " …"
	}
	return line
}
