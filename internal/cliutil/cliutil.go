// Package cliutil holds what the two commands share: printing their
// settings, building their logger, the signal context that stops them and
// connecting to NATS.
//
// It may import pkg/exec (its Connect), internal/telemetry, nats.go and
// envconfig; only the commands (cmd/) import it.
package cliutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/telemetry"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

const settingsFormat = `VARIABLE	DEFAULT	MEANING
{{range .}}{{usage_key .}}	{{usage_default .}}	{{usage_description .}}
{{end}}`

// PrintSettings prints the environment variables spec reads, aligned.
func PrintSettings(w io.Writer, spec any) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	_ = envconfig.Usagef("", spec, tw, settingsFormat)
	_ = tw.Flush()
}

// Logger returns a JSON logger at the named level (info when unknown) that
// adds trace_id and span_id to records logged with a span's context.
func Logger(w io.Writer, level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(telemetry.LogHandler(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: l})))
}

// ConnectNATS connects to url for a long-running service: if the servers
// are not up yet (started at the same time, or restarting), it keeps
// trying with backoff until ctx ends, and once connected it reconnects
// forever. It is [exec.Connect], the one implementation, which library
// users' executors call too. auth carries the credentials (see NATSAuth).
func ConnectNATS(ctx context.Context, url, name string, log *slog.Logger, auth []nats.Option) (*nats.Conn, error) {
	nc, _, err := exec.Connect(ctx, url, exec.ConnectOptions{Name: name, Logger: log, NATS: auth})
	return nc, err
}

// NATSAuth returns the connection options of the credentials the commands'
// NATS_NKEY (an NKEY seed file, as dispatcher nats-config writes) and
// NATS_CREDS (a JWT credentials file) settings name; both empty: none.
func NATSAuth(nkeyFile, credsFile string) ([]nats.Option, error) {
	switch {
	case nkeyFile != "" && credsFile != "":
		return nil, errors.New("settings: set NATS_NKEY or NATS_CREDS, not both")
	case nkeyFile != "":
		opt, err := nats.NkeyOptionFromSeed(nkeyFile)
		if err != nil {
			return nil, fmt.Errorf("settings: NATS_NKEY=%s: %w", nkeyFile, err)
		}
		return []nats.Option{opt}, nil
	case credsFile != "":
		if _, err := os.Stat(credsFile); err != nil {
			return nil, fmt.Errorf("settings: NATS_CREDS: %w", err)
		}
		return []nats.Option{nats.UserCredentials(credsFile)}, nil
	}
	return nil, nil
}
