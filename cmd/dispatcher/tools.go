package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/cliutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// toolsCmd prints the registry as the tool definitions a platform's agent
// configuration takes, so agents are configured from what executors serve.
func toolsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher tools", flag.ContinueOnError)
	fs.SetOutput(stderr)
	platform := fs.String("platform", "responses", "agents, assistants or responses")
	status := fs.Bool("status", false, "print every function with its team, live executors and schemas instead")
	team := fs.String("team", "", "only the functions these teams own (comma-separated)")
	accepted := fs.Bool("accepted", false, "print each function's definition last accepted (description and schema), what agents get under TOOLRELAY_DEFINITION_APPROVAL, instead of the newest executor's")
	owners := fs.Bool("owners", false, "print each definition with its owning team: [{\"team\",\"function\",\"definition_digest\",\"definition\"}]")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher tools [-platform agents|assistants|responses] [-team T[,T...]] [-owners] [-accepted] [-status]\n\n"+
			"Prints the functions live executors serve as a JSON array of tool definitions\n"+
			"(with -owners, each beside the team whose words its description and schema are:\n"+
			"the platforms' definitions have no field for it and refuse unknown ones).\n"+
			"(a function marked defer_loading is emitted so for agents and responses, with one tool_search tool after them).\n"+
			"(functions no executor serves, and executors that disagree on a schema, are reported on stderr).\n"+
			"Connects to NATS_URL, or to the embedded server at TOOLRELAY_NATS_LISTEN (default 127.0.0.1:4222).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	p := protocol.Platform(*platform)
	if err := p.Validate(); err != nil {
		return err
	}
	var teams []string
	if *team != "" {
		teams = strings.Split(*team, ",")
		for _, t := range teams {
			if err := protocol.ValidateTeamName(t); err != nil {
				return fmt.Errorf("-team: %w", err)
			}
		}
	}
	js, closeNC, err := connectTo(natsURLForTools(), "toolrelay-tools")
	if err != nil {
		return err
	}
	defer closeNC()
	all, err := dispatch.Registry(ctx, js)
	if err != nil {
		return err
	}
	if teams != nil {
		all = ownedBy(all, teams)
	}
	if *status {
		printStatus(stdout, all)
		return nil
	}
	var specs []*protocol.FunctionSpec
	for _, f := range all {
		switch {
		case !f.Served():
			fmt.Fprintf(stderr, "not served: %s (team %s) has no live executor; left out\n", f.Spec.Name, f.Spec.Team)
			continue
		case f.Schemas > 1:
			fmt.Fprintf(stderr, "warning: %s: its %d live executors declare %d different schemas; printed is the newest (%s, started %s)\n",
				f.Spec.Name, len(f.Executors), f.Schemas, f.Executors[0].Executor, f.Executors[0].StartedAt.Format(time.RFC3339))
		}
		spec := f.Spec
		switch {
		case f.Changed() && *accepted:
			c := *spec
			c.Description, c.Parameters = f.Accepted.Description, f.Accepted.Parameters
			spec = &c
			fmt.Fprintf(stderr, "note: %s: its executors declare a definition not accepted yet; printed is the one last accepted\n", f.Spec.Name)
		case f.Changed():
			fmt.Fprintf(stderr, "note: %s: its newest executor declares a definition other than the one last accepted; printed is the newest (-accepted prints the other)\n", f.Spec.Name)
		}
		if f.Spec.DeferLoading && p == protocol.PlatformAssistants {
			fmt.Fprintf(stderr, "note: %s is marked defer_loading, which Assistants do not support; printed in full\n", f.Spec.Name)
		}
		specs = append(specs, spec)
	}
	for _, left := range tooldef.Left(specs, p) {
		fmt.Fprintf(stderr, "note: left out: %s\n", left.Reason)
	}
	var out any
	if *owners {
		out, err = tooldef.Export(specs, p)
	} else {
		out, err = tooldef.Definitions(specs, p)
	}
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// ownedBy keeps the functions teams own.
func ownedBy(all []dispatch.FunctionStatus, teams []string) []dispatch.FunctionStatus {
	var out []dispatch.FunctionStatus
	for _, f := range all {
		if slices.Contains(teams, f.Spec.Team) {
			out = append(out, f)
		}
	}
	return out
}

// printStatus prints one line per function: what serves it now.
func printStatus(w io.Writer, all []dispatch.FunctionStatus) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "FUNCTION\tTEAM\tEXECUTORS\tSCHEMAS\tSTATUS")
	for _, f := range all {
		state := "served"
		switch {
		case !f.Served():
			state = "not served: no live executor"
		case f.Schemas > 1:
			state = "served; executors disagree on the schema"
		}
		var names []string
		for _, e := range f.Executors {
			names = append(names, e.Executor+"("+e.Schema+")")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\n", f.Spec.Name, f.Spec.Team, strings.Join(names, ","), f.Schemas, state)
	}
	_ = tw.Flush()
}

// natsURLForTools is NATS_URL, or the address a local dispatcher's
// embedded server listens on.
func natsURLForTools() string {
	if u := os.Getenv("NATS_URL"); u != "" {
		return u
	}
	listen := os.Getenv("TOOLRELAY_NATS_LISTEN")
	if listen == "" {
		listen = "127.0.0.1:4222"
	}
	return "nats://" + listen
}

func connectTo(url, name string) (jetstream.JetStream, func(), error) {
	auth, err := cliutil.NATSAuth(os.Getenv("NATS_NKEY"), os.Getenv("NATS_CREDS"))
	if err != nil {
		return nil, nil, err
	}
	nc, err := nats.Connect(url, append([]nats.Option{nats.Name(name)}, auth...)...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return js, nc.Close, nil
}
