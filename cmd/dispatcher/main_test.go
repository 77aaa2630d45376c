package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// "dispatcher -h" lists every command, and the service's settings.
func TestHelpListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		var out, errOut bytes.Buffer
		if err := run(t.Context(), args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, want := range []string{"serve", "demo", "simulator", "tools", "token", "turns", "turn", "functions", "watches", "TOOLRELAY_API_TOKEN", "TOOLRELAY_SHUTDOWN_TIMEOUT", "TOOLRELAY_API_TOKENS_FILE"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v does not mention %s:\n%s", args, want, out.String())
			}
		}
	}
}

// The service's settings default to the library's defaults: one value,
// declared in pkg/dispatch.
func TestSettingsDefaultToTheLibrarysDefaults(t *testing.T) {
	var cfg config
	if err := envconfig.Process("", &cfg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"TOOLRELAY_SUBMIT_MARGIN", cfg.SubmitMargin, dispatch.DefaultSubmitMargin},
		{"TOOLRELAY_RUN_TTL", cfg.RunTTL, dispatch.DefaultRunTTL},
		{"TOOLRELAY_MAX_STEPS", cfg.MaxSteps, dispatch.DefaultMaxSteps},
		{"TOOLRELAY_SERVE_GRACE", cfg.ServeGrace, dispatch.DefaultServeGrace},
		{"TOOLRELAY_SWEEP_INTERVAL", cfg.SweepInterval, dispatch.DefaultSweepInterval},
		{"TOOLRELAY_MCP_CALL_TIMEOUT", cfg.MCPTimeout, httpapi.DefaultMCPCallTimeout},
		{"TOOLRELAY_MAX_INFLIGHT", cfg.MaxInFlight, dispatch.DefaultMaxInFlightPublishes},
		{"TOOLRELAY_MAX_INFLIGHT_PER_TEAM", cfg.MaxPerTeam, dispatch.DefaultMaxInFlightPerTeam},
		{"TOOLRELAY_SHUTDOWN_TIMEOUT", cfg.Shutdown, dispatch.DefaultShutdownTimeout},
		{"TOOLRELAY_MAX_DECLARATIONS_PER_TEAM", cfg.MaxDecls, dispatch.DefaultMaxDeclarationsPerTeam},
		{"TOOLRELAY_MAX_REGISTRY_BYTES_PER_TEAM", cfg.MaxRegBytes, dispatch.DefaultMaxRegistryBytesPerTeam},
		{"TOOLRELAY_CLAIM_GRACE", cfg.ClaimGrace, dispatch.DefaultClaimGrace},
		{"TOOLRELAY_DECLARE_QUEUE_PER_TEAM", cfg.DeclareQueue, dispatch.DefaultDeclareQueuePerTeam},
		{"TOOLRELAY_AUDIT_RETENTION", cfg.AuditKeep, dispatch.DefaultAuditRetention},
		{"TOOLRELAY_AUDIT_MAX_BYTES", cfg.AuditBytes, dispatch.DefaultAuditBytes},
		{"TOOLRELAY_MCP_SERVER_LABELS", cfg.MCPLabels, dispatch.DefaultMCPServerLabels},
		{"TOOLRELAY_HTTP_READ_TIMEOUT", cfg.ReadTimeout, httpapi.DefaultReadTimeout},
		{"TOOLRELAY_HTTP_WRITE_TIMEOUT", cfg.WriteTimeout, httpapi.DefaultWriteTimeout},
		{"TOOLRELAY_HTTP_IDLE_TIMEOUT", cfg.IdleTimeout, httpapi.DefaultIdleTimeout},
		{"TOOLRELAY_MAX_STREAMS_PER_CALLER", cfg.MaxStreams, httpapi.DefaultMaxStreamsPerCaller},
		{"TOOLRELAY_MAX_MCP_CALLS_PER_CALLER", cfg.MaxMCPCalls, httpapi.DefaultMaxMCPCallsPerCaller},
	} {
		if fmt.Sprint(tc.got) != fmt.Sprint(tc.want) {
			t.Errorf("%s defaults to %v; the library's default is %v", tc.name, tc.got, tc.want)
		}
	}
}
