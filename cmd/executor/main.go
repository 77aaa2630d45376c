// Command executor serves functions to toolrelay's dispatcher through NATS
// JetStream: the seed examples (-demo), or the functions a config file
// declares (-config), each run as a command or forwarded to an HTTP endpoint.
//
// It is wiring only (settings from the environment, then pkg/exec's
// constructors and Run under a signal context) and may import anything.
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
	"time"

	"github.com/kelseyhightower/envconfig"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/internal/demo"
	"github.com/toolrelay/toolrelay/internal/functionsfile"
	"github.com/toolrelay/toolrelay/internal/telemetry"
	"github.com/toolrelay/toolrelay/pkg/exec"
)

// config is the executor's settings, read from the environment.
type config struct {
	NATSURL         string        `envconfig:"NATS_URL" default:"nats://127.0.0.1:4222" desc:"NATS servers to connect to"`
	NATSNKey        string        `envconfig:"NATS_NKEY" desc:"NKEY seed file of the team's NATS user (dispatcher nats-config writes <team>.nk)"`
	NATSCreds       string        `envconfig:"NATS_CREDS" desc:"JWT credentials file of the team's NATS user, instead of NATS_NKEY"`
	ControlPrefix   string        `envconfig:"TOOLRELAY_CONTROL_API_PREFIX" desc:"where the team's account reaches the control plane's JetStream API ($JS.toolrelay.API with dispatcher nats-config); empty: one shared account"`
	Name            string        `envconfig:"TOOLRELAY_EXECUTOR_NAME" desc:"name of this process in results and logs (default: host-random)"`
	ShutdownTimeout time.Duration `envconfig:"TOOLRELAY_SHUTDOWN_TIMEOUT" default:"10s" desc:"how long running calls may finish after SIGTERM"`
	AckWait         time.Duration `envconfig:"TOOLRELAY_ACK_WAIT" default:"30s" desc:"a call whose executor goes silent this long is redelivered (heartbeats every third of it)"`
	Replicas        int           `envconfig:"TOOLRELAY_REPLICAS" default:"1" desc:"replicas of streams the executor creates (3 on a cluster)"`
	LogLevel        string        `envconfig:"TOOLRELAY_LOG_LEVEL" default:"info" desc:"debug, info, warn or error"`
	MetricsAddr     string        `envconfig:"TOOLRELAY_METRICS_ADDR" desc:"serve GET /metrics (Prometheus) on this address; empty: no HTTP server"`
}

func main() {
	ctx, stop := cliutil.SignalContext(context.Background(), os.Stderr)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "dlq" {
		return dlqCmd(ctx, args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("executor", flag.ContinueOnError)
	fs.SetOutput(stderr)
	demoMode := fs.Bool("demo", false, "serve the seed example functions (team \"demo\")")
	configPath := fs.String("config", "", "serve the functions declared in this YAML (or JSON) file")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: executor -demo | -config functions.yaml\n       executor dlq list [-team T] [-json] | executor dlq replay [-timeout 5m] <call-key>\n\nFlags:")
		fs.PrintDefaults()
		fmt.Fprintln(stderr, "\nSettings (environment variables):")
		cliutil.PrintSettings(stderr, &config{})
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *demoMode == (*configPath != "") {
		fs.Usage()
		return errors.New("give exactly one of -demo and -config")
	}
	var cfg config
	if err := envconfig.Process("", &cfg); err != nil {
		return fmt.Errorf("settings: %w", err)
	}
	log := cliutil.Logger(stderr, cfg.LogLevel)
	tel, err := telemetry.Setup(ctx, telemetry.Options{Service: "toolrelay-executor"})
	if err != nil {
		return err
	}
	defer tel.Close()
	if cfg.MetricsAddr != "" {
		stopMetrics, err := serveMetrics(cfg.MetricsAddr, tel.Metrics)
		if err != nil {
			return err
		}
		defer stopMetrics()
	}

	teams := map[string][]exec.Function{demo.Team: demo.Functions()}
	if !*demoMode {
		var err error
		if teams, err = functionsfile.Load(*configPath); err != nil {
			return err
		}
	}

	auth, err := cliutil.NATSAuth(cfg.NATSNKey, cfg.NATSCreds)
	if err != nil {
		return err
	}
	nc, js, err := exec.Connect(ctx, cfg.NATSURL, exec.ConnectOptions{Name: "toolrelay-executor", Logger: log, NATS: auth})
	if errors.Is(err, exec.ErrBadURL) {
		return fmt.Errorf("NATS_URL: %w", err)
	}
	if err != nil {
		return err
	}
	defer nc.Close()
	return serveTeams(ctx, js, teams, cfg, log, stdout)
}

// serveTeams runs one executor per team (a file may declare functions of
// several) until ctx ends or one of them stops.
func serveTeams(ctx context.Context, js jetstream.JetStream, teams map[string][]exec.Function, cfg config, log *slog.Logger, stdout io.Writer) error {
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, len(teams))
	var outMu sync.Mutex // the announcements below come from several goroutines
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Fprintf(stdout, format, args...)
	}
	var announcing sync.WaitGroup
	for team, funcs := range teams {
		ex, err := exec.New(js, team, exec.Options{
			Logger: log, Name: cfg.Name, ShutdownTimeout: cfg.ShutdownTimeout, Replicas: cfg.Replicas, AckWait: cfg.AckWait,
			ControlAPIPrefix: cfg.ControlPrefix,
		})
		if err != nil {
			return err
		}
		for _, f := range funcs {
			if err := ex.Register(f); err != nil {
				return err
			}
		}
		// It serves once it has declared its functions; a name another
		// team owns is refused before that.
		say("executor starting: %d function(s) of team %q from %s\n", len(funcs), team, cfg.NATSURL)
		announcing.Go(func() {
			select {
			case <-ex.Serving():
				say("executor serving %d function(s) of team %q\n", len(funcs), team)
			case <-ctx.Done():
			}
		})
		go func() { errc <- ex.Run(ctx) }()
	}
	// The first executor to stop (an error, or the signal) stops the rest.
	var errs []error
	for range teams {
		err := <-errc
		cancel()
		errs = append(errs, err)
	}
	announcing.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// A clean stop is a signal (the cause names it) or the parent's end.
	why := "stopped"
	if cause := context.Cause(parent); cause != nil {
		why = cause.Error()
	}
	say("executor stopped (%s): declarations withdrawn, running calls finished or handed back\n", why)
	return nil
}

// serveMetrics serves GET /metrics on addr until stop is called.
func serveMetrics(addr string, metrics http.Handler) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", metrics)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: time.Minute, IdleTimeout: time.Minute}
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Serve(ln) }()
	return func() { _ = srv.Close(); <-done }, nil
}
