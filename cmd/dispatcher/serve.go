package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/openai/openai-go/v3"

	"github.com/toolrelay/toolrelay/internal/apiauth"
	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/internal/console"
	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/natsembed"
	"github.com/toolrelay/toolrelay/internal/platformauth"
	"github.com/toolrelay/toolrelay/internal/telemetry"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
)

// config is the dispatcher service's settings, read from the environment.
type config struct {
	NATSURL       string        `envconfig:"NATS_URL" desc:"NATS servers to use; empty starts an embedded JetStream server"`
	NATSNKey      string        `envconfig:"NATS_NKEY" desc:"NKEY seed file of the dispatcher's NATS user (dispatcher nats-config writes dispatcher.nk)"`
	NATSCreds     string        `envconfig:"NATS_CREDS" desc:"JWT credentials file of the dispatcher's NATS user, instead of NATS_NKEY"`
	NATSListen    string        `envconfig:"TOOLRELAY_NATS_LISTEN" default:"127.0.0.1:4222" desc:"client address of the embedded server"`
	DataDir       string        `envconfig:"TOOLRELAY_DATA_DIR" default:"./toolrelay-data" desc:"where the embedded server stores"`
	HTTPAddr      string        `envconfig:"TOOLRELAY_HTTP_ADDR" default:":8080" desc:"HTTP API address (/v1, /mcp, the console at /ui, /healthz, /readyz, and /metrics unless TOOLRELAY_METRICS_ADDR is set)"`
	MetricsAddr   string        `envconfig:"TOOLRELAY_METRICS_ADDR" desc:"serve GET /metrics on this address of its own, open to whoever reaches it (a private address); empty: on TOOLRELAY_HTTP_ADDR"`
	MetricsAdmin  bool          `envconfig:"TOOLRELAY_METRICS_ADMIN_ONLY" desc:"on TOOLRELAY_HTTP_ADDR, serve /metrics to admin tokens only (loopback clients only without tokens): they name every team and function; default: open, as /healthz"`
	ReadTimeout   time.Duration `envconfig:"TOOLRELAY_HTTP_READ_TIMEOUT" default:"30s" desc:"longest a client may take to send a whole request, body included"`
	WriteTimeout  time.Duration `envconfig:"TOOLRELAY_HTTP_WRITE_TIMEOUT" default:"60s" desc:"longest an answer may take to write; event streams and /mcp answers get it for each write instead"`
	IdleTimeout   time.Duration `envconfig:"TOOLRELAY_HTTP_IDLE_TIMEOUT" default:"60s" desc:"longest a kept-alive connection waits for its next request"`
	MaxStreams    int           `envconfig:"TOOLRELAY_MAX_STREAMS_PER_CALLER" default:"16" desc:"event streams (GET /v1/turns/stream, MCP subscriptions/listen) one caller (a token, or all loopback clients) may hold open at once"`
	MaxMCPCalls   int           `envconfig:"TOOLRELAY_MAX_MCP_CALLS_PER_CALLER" default:"64" desc:"tools/call one caller may have running at once on /mcp; more fail at once as unavailable"`
	APITokens     string        `envconfig:"TOOLRELAY_API_TOKENS_FILE" desc:"bearer tokens /v1, /mcp and /ui need (hashes, each scoped to admin or teams; see dispatcher token), re-read when it changes; empty: they serve loopback clients only"`
	PublicURL     string        `envconfig:"TOOLRELAY_PUBLIC_URL" desc:"the HTTP API's address as clients reach it (https://tools.example.com): with tokens, /mcp's OAuth protected-resource metadata names it; empty: each request's scheme and Host"`
	AuthServers   []string      `envconfig:"TOOLRELAY_MCP_AUTHORIZATION_SERVERS" desc:"comma-separated issuer URLs of OAuth authorization servers whose tokens reach /mcp through a proxy that checks them (docs/security.md), listed in /mcp's protected-resource metadata"`
	TraceURL      string        `envconfig:"TOOLRELAY_TRACE_URL" desc:"link the console's trace ids to a tracing UI: {trace_id} is replaced by the id (https://jaeger.example/trace/{trace_id})"`
	SubmitMargin  time.Duration `envconfig:"TOOLRELAY_SUBMIT_MARGIN" default:"30s" desc:"submit this long before a run expires"`
	RunTTL        time.Duration `envconfig:"TOOLRELAY_RUN_TTL" default:"10m" desc:"expiry assumed where the platform gives none"`
	MaxSteps      int           `envconfig:"TOOLRELAY_MAX_STEPS" default:"16" desc:"most turns one watch drives"`
	ServeGrace    time.Duration `envconfig:"TOOLRELAY_SERVE_GRACE" default:"3s" desc:"how long a call waits for an executor of a function nobody serves (at intake, or after its last executor went) before failing as unavailable"`
	SweepInterval time.Duration `envconfig:"TOOLRELAY_SWEEP_INTERVAL" default:"10s" desc:"how often each replica repairs turns and watches a dead replica left"`
	MCPTimeout    time.Duration `envconfig:"TOOLRELAY_MCP_CALL_TIMEOUT" default:"60s" desc:"longest a tools/call on /mcp may run (a function's own timeout, if shorter, applies)"`
	MaxInFlight   int           `envconfig:"TOOLRELAY_MAX_INFLIGHT" default:"4096" desc:"calls being published at once"`
	MaxPerTeam    int           `envconfig:"TOOLRELAY_MAX_INFLIGHT_PER_TEAM" default:"1024" desc:"one team's share of them"`
	Replicas      int           `envconfig:"TOOLRELAY_REPLICAS" default:"1" desc:"replicas of streams and buckets (3 on a cluster)"`
	LogLevel      string        `envconfig:"TOOLRELAY_LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	ResultBytes   int64         `envconfig:"TOOLRELAY_TEAM_RESULT_BYTES" default:"268435456" desc:"size limit of each team's result stream, so one team's flood fills only its own"`
	MaxDecls      int           `envconfig:"TOOLRELAY_MAX_DECLARATIONS_PER_TEAM" default:"4096" desc:"live declarations (function × executor process) one team may have, and function names it may own"`
	MaxRegBytes   int64         `envconfig:"TOOLRELAY_MAX_REGISTRY_BYTES_PER_TEAM" default:"8388608" desc:"bytes one team's live declarations and claims may take in the registry"`
	ClaimGrace    time.Duration `envconfig:"TOOLRELAY_CLAIM_GRACE" default:"1h" desc:"how long a team keeps a function name after its last executor of it stops; then the name is free"`
	DeclareQueue  int           `envconfig:"TOOLRELAY_DECLARE_QUEUE_PER_TEAM" default:"64" desc:"declare requests of one team waiting at a replica; more are answered busy and sent again by the executor"`
	DefApproval   bool          `envconfig:"TOOLRELAY_DEFINITION_APPROVAL" default:"false" desc:"hold a changed description or schema of a served function back from agents until an admin accepts it (POST /v1/functions/{name}/accept); false: a change reaches agents at once, logged and counted"`
	AuditKeep     time.Duration `envconfig:"TOOLRELAY_AUDIT_RETENTION" default:"2160h" desc:"how long the audit trail (approval requests and decisions, runs of side-effecting functions) keeps an entry; 2160h is 90 days"`
	AuditBytes    int64         `envconfig:"TOOLRELAY_AUDIT_MAX_BYTES" default:"1073741824" desc:"storage the audit trail may take; when full, its oldest entries go first"`
	HookURL       string        `envconfig:"TOOLRELAY_APPROVAL_WEBHOOK_URL" desc:"receives a POST of each call held for approval, signed as Standard Webhooks are; empty: none (the NATS announcements remain)"`
	HookSecret    secret        `envconfig:"TOOLRELAY_APPROVAL_WEBHOOK_SECRET" desc:"signs the approval webhook: whsec_ and the key in base64, or the key; required with the URL"`
	MCPLabels     []string      `envconfig:"TOOLRELAY_MCP_SERVER_LABELS" default:"toolrelay" desc:"server_label values agents give this dispatcher's /mcp, comma-separated: an mcp_approval_request under one of them is decided by its function's approval policy; any other server's waits for an admin"`
	TeamAPIPrefix string        `envconfig:"TOOLRELAY_TEAM_API_PREFIX" desc:"where each team's account's JetStream API is reached, {team} for the team: $JS.team.{team}.API under dispatcher nats-config (dispatcher.env sets it), read-only, for queue figures and dead letters; empty: one shared account"`
	Shutdown      time.Duration `envconfig:"TOOLRELAY_SHUTDOWN_TIMEOUT" default:"10s" desc:"after SIGTERM, how long submissions in progress may finish before they are left to another replica or the restart"`
	OpenAIAPIKey  secret        `envconfig:"OPENAI_API_KEY" desc:"platform API key, or a bearer token for Foundry project endpoints"`
	OpenAIBaseURL string        `envconfig:"OPENAI_BASE_URL" desc:"platform base URL; Foundry: {project endpoint}/openai/v1"`
	WebhookSecret secret        `envconfig:"OPENAI_WEBHOOK_SECRET" desc:"verifies POST /webhooks/openai (whsec_...); empty: webhooks get 401"`
	TokenFile     string        `envconfig:"TOOLRELAY_BEARER_TOKEN_FILE" desc:"a bearer token (Foundry/Entra) re-read whenever the file changes; overrides OPENAI_API_KEY"`
	AzureEndpoint string        `envconfig:"TOOLRELAY_AZURE_ENDPOINT" desc:"Azure OpenAI resource endpoint (https://<name>.openai.azure.com) instead of OPENAI_BASE_URL"`
	AzureVersion  string        `envconfig:"TOOLRELAY_AZURE_API_VERSION" default:"2025-04-01-preview" desc:"api-version for the Azure endpoint"`
	AzureAPIKey   secret        `envconfig:"AZURE_OPENAI_API_KEY" desc:"key for the Azure endpoint"`
	// CrashAt kills the process (SIGKILL) when a turn reaches this stage:
	// for resilience tests only.
	CrashAt string `envconfig:"TOOLRELAY_TEST_CRASH_AT" desc:"tests only: kill -9 this process when a turn reaches intake, fanout, gather or submitted"`
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher [serve]\n\nSettings (environment variables):")
		cliutil.PrintSettings(stderr, &config{})
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var cfg config
	if err := envconfig.Process("", &cfg); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	if err := cfg.checkResource(); err != nil {
		return err
	}
	log := cliutil.Logger(stderr, cfg.LogLevel)
	var wg sync.WaitGroup
	defer wg.Wait() // the tokens file's follower, once the stopTokens deferred below has run
	var auth httpapi.Authenticator
	if cfg.APITokens != "" {
		tokens, err := apiauth.Open(cfg.APITokens, apiauth.Options{Logger: log.With("component", "api-tokens")})
		if err != nil {
			return err
		}
		tctx, stopTokens := context.WithCancel(ctx)
		defer stopTokens()
		wg.Go(func() { tokens.Run(tctx) })
		auth = tokens
		log.Info("HTTP API: every request to /v1 and /mcp needs a bearer token", "file", tokens.Path(), "tokens", tokens.Len())
	} else {
		log.Warn("HTTP API: /v1 and /mcp serve loopback clients only; set TOOLRELAY_API_TOKENS_FILE to serve others")
	}
	tel, err := telemetry.Setup(ctx, telemetry.Options{Service: "toolrelay-dispatcher"})
	if err != nil {
		return err
	}
	defer tel.Close()

	// The HTTP address first: a taken port stops the start before the
	// embedded server creates its store.
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("the HTTP API cannot listen on %s (TOOLRELAY_HTTP_ADDR): %w; set TOOLRELAY_HTTP_ADDR to a free address, e.g. :8081", cfg.HTTPAddr, err)
	}
	defer ln.Close()
	var metricsLn net.Listener
	if cfg.MetricsAddr != "" {
		if metricsLn, err = net.Listen("tcp", cfg.MetricsAddr); err != nil {
			return fmt.Errorf("metrics cannot listen on %s (TOOLRELAY_METRICS_ADDR): %w; set it to a free address, or empty to serve /metrics on the API's", cfg.MetricsAddr, err)
		}
		defer metricsLn.Close()
	}

	natsURL := cfg.NATSURL
	if natsURL == "" {
		s, err := natsembed.Start(natsembed.Options{Listen: cfg.NATSListen, StoreDir: cfg.DataDir, Logger: log.With("component", "nats-server")})
		if errors.Is(err, natsembed.ErrPortTaken) {
			return fmt.Errorf("%w (TOOLRELAY_NATS_LISTEN); if it is another dispatcher's embedded server, join it as a replica with NATS_URL=nats://%s, or set TOOLRELAY_NATS_LISTEN to a free address", err, cfg.NATSListen)
		}
		if err != nil {
			return err
		}
		defer func() { s.Shutdown(); s.WaitForShutdown() }()
		natsURL = s.ClientURL()
		log.Info("embedded JetStream server started", "url", natsURL, "data_dir", cfg.DataDir)
	}
	natsAuth, err := cliutil.NATSAuth(cfg.NATSNKey, cfg.NATSCreds)
	if err != nil {
		return err
	}
	nc, err := cliutil.ConnectNATS(ctx, natsURL, "toolrelay-dispatcher", log, natsAuth)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		return err
	}

	opts, err := platformauth.Options(platformauth.Config{
		APIKey: string(cfg.OpenAIAPIKey), BaseURL: cfg.OpenAIBaseURL, TokenFile: cfg.TokenFile,
		AzureEndpoint: cfg.AzureEndpoint, AzureAPIVersion: cfg.AzureVersion, AzureAPIKey: string(cfg.AzureAPIKey),
	})
	if err != nil {
		return err
	}
	client := openai.NewClient(opts...)
	dopts := dispatch.Options{
		Logger: log, SubmitMargin: cfg.SubmitMargin, RunTTL: cfg.RunTTL, MaxSteps: cfg.MaxSteps, Replicas: cfg.Replicas,
		ServeGrace: cfg.ServeGrace, SweepInterval: cfg.SweepInterval,
		MaxInFlightPublishes: cfg.MaxInFlight, MaxInFlightPerTeam: cfg.MaxPerTeam, ShutdownTimeout: cfg.Shutdown,
		ResultStreamBytes: cfg.ResultBytes, MaxDeclarationsPerTeam: cfg.MaxDecls, TeamAPIPrefix: cfg.TeamAPIPrefix,
		MaxRegistryBytesPerTeam: cfg.MaxRegBytes, ClaimGrace: cfg.ClaimGrace, DeclareQueuePerTeam: cfg.DeclareQueue,
		DefinitionApproval: cfg.DefApproval, AuditRetention: cfg.AuditKeep, AuditBytes: cfg.AuditBytes,
		MCPServerLabels: cfg.MCPLabels, ApprovalWebhookURL: cfg.HookURL, ApprovalWebhookSecret: string(cfg.HookSecret),
	}
	if cfg.WebhookSecret != "" {
		dopts.Webhooks = openaiplatform.Webhooks(string(cfg.WebhookSecret))
	}
	if cfg.CrashAt != "" {
		if !crashpoint.Valid(cfg.CrashAt) {
			return fmt.Errorf("settings: TOOLRELAY_TEST_CRASH_AT=%q: want intake, fanout, gather or submitted", cfg.CrashAt)
		}
		defer crashpoint.Add(crashAt(cfg.CrashAt, log))()
	}
	d, err := dispatch.New(js, openaiplatform.New(client), dopts)
	if err != nil {
		return err
	}
	watch.New(d, js)

	timeouts := httpapi.Timeouts{Read: cfg.ReadTimeout, Write: cfg.WriteTimeout, Idle: cfg.IdleTimeout}
	aopts := httpapi.Options{Logger: log, Authenticator: auth, MCPCallTimeout: cfg.MCPTimeout, Timeouts: timeouts,
		MaxStreamsPerCaller: cfg.MaxStreams, MaxMCPCallsPerCaller: cfg.MaxMCPCalls,
		PublicURL: cfg.PublicURL, AuthorizationServers: cfg.AuthServers}
	httpErr := make(chan error, 2)
	if metricsLn == nil {
		aopts.Metrics, aopts.GuardMetrics = tel.Metrics, cfg.MetricsAdmin
	} else {
		metricsMux := http.NewServeMux()
		metricsMux.Handle("GET /metrics", tel.Metrics)
		msrv := httpapi.NewServer(metricsMux, timeouts)
		go func() { httpErr <- fmt.Errorf("metrics: %w", msrv.Serve(metricsLn)) }()
		defer msrv.Close()
		log.Info("metrics listening", "addr", metricsLn.Addr().String())
	}
	api := httpapi.New(d, aopts)
	mux := http.NewServeMux()
	mux.Handle("/", api)
	ui, err := console.New(d, api, console.Options{Logger: log, TraceURL: cfg.TraceURL})
	if err != nil {
		return err
	}
	ui.Mount(mux) // /ui and /v1/deadletters, behind the API's tokens
	srv := httpapi.NewServer(mux, timeouts)
	go func() { httpErr <- fmt.Errorf("HTTP API: %w", srv.Serve(ln)) }()
	log.Info("HTTP API listening", "addr", ln.Addr().String())

	// Run ends when ctx does (a signal), or at once if it cannot start; a
	// failing HTTP server stops it too.
	rctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	runErr := make(chan error, 1)
	go func() { runErr <- d.Run(rctx) }()
	var runDone bool
	select {
	case <-ctx.Done():
		log.Info("stopping", "cause", context.Cause(ctx).Error(), "timeout", cfg.Shutdown.String())
	case err = <-runErr:
		runDone = true
	case err = <-httpErr:
	}
	stopRun()
	// Stop taking requests while Run hands its open turns over; both are
	// bounded by the shutdown timeout.
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.Shutdown)
	defer cancel()
	if herr := srv.Shutdown(sctx); herr != nil {
		log.Warn("HTTP API did not stop in time; closing its connections", "err", herr)
		_ = srv.Close()
	}
	if !runDone {
		err = errors.Join(err, <-runErr)
	}
	if err == nil {
		log.Info("stopped")
	}
	return err // then NATS is closed and the embedded server shut down
}

// crashAt kills this process with SIGKILL, as an operator's kill -9 would,
// the first time a turn reaches stage.
func crashAt(stage string, log *slog.Logger) func(point, process, turn string) {
	return func(s, _, key string) {
		if s == stage {
			log.Warn("crashing on purpose (TOOLRELAY_TEST_CRASH_AT)", "stage", s, "turn", key)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // SIGKILL is not delivered synchronously
		}
	}
}

// secret is a setting never to be printed or logged.
type secret string

func (secret) String() string       { return "REDACTED" }
func (secret) LogValue() slog.Value { return slog.StringValue("REDACTED") }
func (s secret) GoString() string   { return s.String() }

// checkResource checks the settings /mcp's protected-resource metadata
// names: the API's public address and each authorization server's issuer.
func (c *config) checkResource() error {
	if c.PublicURL != "" {
		if err := httpapi.CheckPublicURL(c.PublicURL); err != nil {
			return fmt.Errorf("TOOLRELAY_PUBLIC_URL: %w", err)
		}
	}
	for _, s := range c.AuthServers {
		if err := httpapi.CheckPublicURL(s); err != nil {
			return fmt.Errorf("TOOLRELAY_MCP_AUTHORIZATION_SERVERS: %w", err)
		}
	}
	if len(c.AuthServers) > 0 && c.APITokens == "" {
		return errors.New("TOOLRELAY_MCP_AUTHORIZATION_SERVERS is set without TOOLRELAY_API_TOKENS_FILE: without tokens /mcp serves " +
			"loopback clients only and there is nothing to authorize; set both, or neither")
	}
	return nil
}
