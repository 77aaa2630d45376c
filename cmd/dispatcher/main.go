// Command dispatcher runs toolrelay's dispatcher: it learns of the function
// calls agent platforms wait for, runs them on executors through NATS
// JetStream, and submits their results before the run expires.
//
//	dispatcher [serve]   the service (settings from the environment)
//	dispatcher demo      offline demo: embedded JetStream, platform simulator, seed executors
//	dispatcher dev       a team's local loop: its functions file and scenarios, reloaded on change
//	dispatcher call      run one function through a running dispatcher's /mcp
//	dispatcher simulator serve the platform simulator alone (for trying the service locally)
//	dispatcher tools     print the registry as a platform's tool definitions
//	dispatcher token     make a bearer token for the HTTP API (TOOLRELAY_API_TOKENS_FILE)
//	dispatcher nats-config  write the NATS server configuration for a set of teams
//	dispatcher conformance  drive an executor through the protocol's cases (the conformance kit)
//	dispatcher turns     open and recently closed turns, from a running dispatcher's API
//	dispatcher turn      one turn and each call's result
//	dispatcher functions functions, their executors, queues and figures
//	dispatcher watches   active and recently ended watches
//
// It is wiring only (settings from the environment, then pkg/dispatch's
// constructors and Run under a signal context) and may import anything.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/toolrelay/toolrelay/internal/cliutil"
)

func main() {
	ctx, stop := cliutil.SignalContext(context.Background(), os.Stderr)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "dispatcher:", err)
		}
		os.Exit(exitCode(err))
	}
}

func exitCode(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 1
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cmd := "serve"
	switch {
	case len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help"):
		cmd = "help" // the command list; "dispatcher serve -h" lists the settings
	case len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-':
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, stdout, stderr)
	case "demo":
		return demoCmd(ctx, args, stdout, stderr)
	case "dev":
		return devCmd(ctx, args, stdout, stderr)
	case "call":
		return callCmd(ctx, args, stdout, stderr)
	case "simulator":
		return simulatorCmd(ctx, args, stdout, stderr)
	case "tools":
		return toolsCmd(ctx, args, stdout, stderr)
	case "token":
		return tokenCmd(ctx, args, stdout, stderr)
	case "nats-config":
		return natsConfigCmd(args, stdout, stderr)
	case "turns":
		return turnsCmd(ctx, args, stdout, stderr)
	case "turn":
		return turnCmd(ctx, args, stdout, stderr)
	case "functions":
		return functionsCmd(ctx, args, stdout, stderr)
	case "watches":
		return watchesCmd(ctx, args, stdout, stderr)
	case "conformance":
		return conformanceCmd(ctx, args, stdout, stderr)
	case "approvals":
		return approvalsCmd(ctx, args, stdout, stderr)
	case "approve", "deny":
		return decideCmd(cmd)(ctx, args, stdout, stderr)
	case "audit":
		return auditCmd(ctx, args, stdout, stderr)
	case "help":
		usage(stdout)
		fmt.Fprintln(stdout, "\nSettings of serve (environment variables):")
		cliutil.PrintSettings(stdout, &config{})
		return nil
	}
	usage(stderr)
	return fmt.Errorf("unknown command %q", cmd)
}

func usage(w io.Writer) {
	fmt.Fprint(w, `usage: dispatcher [serve|demo|dev|call|simulator|tools|token|nats-config|conformance|turns|turn|functions|watches|approvals|approve|deny|audit] [flags]

  serve       run the dispatcher service (the default); settings come from the environment,
              see "dispatcher serve -h"
  demo        play one example per platform offline: embedded JetStream, platform simulator,
              in-process seed executors; exits 0 when every answer arrived
  dev         run a team's functions file locally with the simulator playing its scenarios;
              reloads and plays again when the files change
  call        run one function through a running dispatcher (its /mcp) and print the result
  simulator   serve the platform simulator alone, to try the service without OpenAI
  tools       print the functions executors serve as a platform's tool definitions
  token       make a bearer token for the HTTP API and the line for TOOLRELAY_API_TOKENS_FILE
  nats-config write the NATS server configuration, NKEY users and env files for a set of
              teams, one account each (run it again to add a team)
  conformance drive an executor in any language through docs/protocol.md, PASS/FAIL per case:
              -team T [-function F,...] [-nats URL] [-exec "command" | -go]

Inspecting a running dispatcher through its HTTP API (-addr, default http://127.0.0.1:8080;
the bearer token from TOOLRELAY_API_TOKEN; -json prints the API's JSON):
  turns       open turns racing their deadlines and recently closed ones
              [-open] [-team T] [-function F] [-platform P] [-outcome O]
  turn        one turn by key, with each call's result, duration, executor and attempts
  functions   functions: owner, version, executors, concurrency cap, queue, rate, errors,
              p50/p99, schema disagreement; functions reserve|transfer|release NAME: who owns a name
  watches     active and recently ended watches: state, steps, answer

Deciding calls held for approval, and reading the audit trail (docs/approvals.md):
  approvals   calls awaiting a decision, soonest auto-deny first [-team T] [-all]
  approve     approve a held call: it runs           approve [-reason R] <call key>
  deny        deny a held call: the model reads why  deny -reason R <call key>
  audit       approval requests, decisions and side-effecting runs [-team T] [-since 24h];
              -json prints JSON lines

"dispatcher <command> -h" lists a command's flags and settings.
`)
}
