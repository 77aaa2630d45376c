package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

func simulatorCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher simulator", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:8090", "listen address")
	key := fs.String("api-key", "", "require this API key (Bearer or Api-Key header); empty accepts any")
	ttl := fs.Duration("run-ttl", 10*time.Minute, "Assistants runs expire this long after creation")
	scenariosFile := fs.String("scenarios", "", "also play the scenarios of this YAML file (before the seed examples; see testdata/scenarios.yaml)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	scenarios := platformsim.SeedScenarios()
	if *scenariosFile != "" {
		own, err := platformsim.LoadScenarios(*scenariosFile)
		if err != nil {
			return err
		}
		scenarios = append(own, scenarios...)
		fmt.Fprintf(stdout, "playing %d scenario(s) from %s\n", len(own), *scenariosFile)
	}
	sim := platformsim.New(platformsim.Options{
		Model: &platformsim.Model{Scenarios: scenarios}, APIKey: *key, RunTTL: *ttl,
		Logger: cliutil.Logger(stderr, "warn"),
	})
	defer sim.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("the simulator cannot listen on %s (-addr): %w; give -addr a free address", *addr, err)
	}
	fmt.Fprintf(stdout, "platform simulator listening on http://%s/v1 (OPENAI_BASE_URL)\n", ln.Addr())
	// The simulator's event streams last as long as a run: no write timeout.
	srv := httpapi.NewServer(sim, httpapi.Timeouts{Write: -1})
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
