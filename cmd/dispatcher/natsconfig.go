package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/toolrelay/toolrelay/internal/tenancy"
)

// natsConfigCmd writes the NATS configuration of a deployment with one
// account per team (see internal/tenancy and docs/security.md).
func natsConfigCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher nats-config", flag.ContinueOnError)
	fs.SetOutput(stderr)
	teams := fs.String("teams", "", "comma-separated team names (required), e.g. orders,billing")
	out := fs.String("out", "toolrelay-nats-config", "directory to write into; seeds already there are kept")
	cluster := fs.Int("cluster", 1, "nodes: 1 writes server.conf, 3 writes n1.conf, n2.conf, n3.conf")
	host := fs.String("host", "127.0.0.1", "address the nodes listen on and route to")
	port := fs.Int("port", 4222, "client port of the first node (node i listens on port+i-1)")
	routePort := fs.Int("route-port", 6222, "route port of the first node")
	store := fs.String("store", "./toolrelay-nats", "JetStream store directory (node i under <store>/n<i>)")
	maxFile := fs.Int64("team-max-file", 1<<30, "bytes of file storage each team's account may use")
	maxAck := fs.Int("team-max-ack-pending", 100000, "calls in flight each team's account may have")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher nats-config -teams orders,billing [-cluster 3] [-out DIR]\n\n"+
			"Writes accounts.conf, the server file(s), an NKEY seed per user (dispatcher.nk, <team>.nk)\n"+
			"and an env file per user (dispatcher.env, <team>.env) for the dispatcher and executors.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *teams == "" {
		fs.Usage()
		return errors.New("nats-config: -teams is required")
	}
	res, err := tenancy.Write(*out, tenancy.Options{
		Teams: strings.Split(*teams, ","), Cluster: *cluster, Host: *host, ClientPort: *port, ClusterPort: *routePort,
		StoreDir: *store, Limits: tenancy.Limits{MaxFile: *maxFile, MaxAckPending: *maxAck},
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (accounts.conf, %s)\n", *out, strings.Join(baseNames(res.Servers), ", "))
	if len(res.Created) > 0 {
		fmt.Fprintf(stdout, "new keys: %s (keep them secret; existing ones were kept)\n", strings.Join(res.Created, ", "))
	}
	fmt.Fprintf(stdout, "start:      nats-server -c %s\n", res.Servers[0])
	// The env files' values are single-quoted (a shell would expand the
	// "$JS" of the API prefixes otherwise): source them, don't cat them.
	fmt.Fprintf(stdout, "dispatcher: (set -a; . %s; exec dispatcher)\n", shellPath(*out, "dispatcher.env"))
	fmt.Fprintf(stdout, "executors:  (set -a; . %s; exec executor -config functions.yaml)\n", shellPath(*out, "<team>.env"))
	return nil
}

// shellPath is dir/file as a shell command line can take it.
func shellPath(dir, file string) string {
	p := filepath.Join(dir, file)
	if !strings.HasPrefix(p, "/") {
		p = "./" + p // "." searches PATH for a name without a slash
	}
	if strings.ContainsAny(p, " '\"$`\\*?[]<>|&;(){}#~") {
		return "'" + strings.ReplaceAll(p, "'", `'\''`) + "'"
	}
	return p
}

func baseNames(paths []string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = p[strings.LastIndex(p, "/")+1:]
	}
	return out
}
