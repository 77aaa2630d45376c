package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// toolsCmd prints the registry as the tool definitions a platform's agent
// configuration takes, so agents are configured from what executors serve.
func toolsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher tools", flag.ContinueOnError)
	fs.SetOutput(stderr)
	platform := fs.String("platform", "responses", "agents, assistants or responses")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher tools [-platform agents|assistants|responses]\n\n"+
			"Prints the functions executors announced as a JSON array of tool definitions.\n"+
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
	js, closeNC, err := connectTo(natsURLForTools(), "toolrelay-tools")
	if err != nil {
		return err
	}
	defer closeNC()
	specs, err := dispatch.Functions(ctx, js)
	if err != nil {
		return err
	}
	defs, err := dispatch.ToolDefinitions(specs, p)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(defs)
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
	nc, err := nats.Connect(url, nats.Name(name))
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
