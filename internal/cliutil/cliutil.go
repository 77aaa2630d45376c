// Package cliutil holds what the two commands share: printing their
// settings and building their logger.
package cliutil

import (
	"io"
	"log/slog"
	"text/tabwriter"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolrelay/toolrelay/internal/telemetry"
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
