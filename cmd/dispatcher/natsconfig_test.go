package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolrelay/toolrelay/internal/tenancy"
)

// Every limit nats-config writes can be tuned by a flag, and the result
// streams' size reaches the dispatcher's env file.
func TestNATSConfigFlagsTuneLimits(t *testing.T) {
	dir := t.TempDir()
	if err := natsConfigCmd([]string{"-teams", "orders,billing", "-out", dir,
		"-team-max-file", "101", "-team-max-mem", "102", "-team-max-streams", "103", "-team-max-consumers", "104",
		"-team-max-ack-pending", "105", "-team-max-connections", "106", "-team-max-subscriptions", "107", "-team-max-payload", "108",
		"-control-max-file", "109", "-control-max-mem", "110", "-control-max-streams", "111", "-control-max-consumers", "112",
		"-team-result-bytes", "113", "-max-pending", "114"}, io.Discard, io.Discard); err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	accounts := read("accounts.conf")
	for _, want := range []string{
		"jetstream: { max_file: 101, max_mem: 102, max_streams: 103, max_consumers: 104, max_ack_pending: 105 }",
		"limits: { max_connections: 106, max_subscriptions: 107, max_payload: 108 }",
		"jetstream: { max_file: 109, max_mem: 110, max_streams: 111, max_consumers: 112 }",
	} {
		if !strings.Contains(accounts, want) {
			t.Errorf("accounts.conf lacks %q:\n%s", want, accounts)
		}
	}
	if got := read("server.conf"); !strings.Contains(got, "max_pending: 114") {
		t.Errorf("server.conf lacks max_pending: 114:\n%s", got)
	}
	vars, err := tenancy.ReadEnvFile(filepath.Join(dir, "dispatcher.env"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(vars, "\n"), "TOOLRELAY_TEAM_RESULT_BYTES=113") {
		t.Errorf("dispatcher.env sets %q, want TOOLRELAY_TEAM_RESULT_BYTES=113", vars)
	}
}
