package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/toolrelay/toolrelay/internal/tenancy"
	"github.com/toolrelay/toolrelay/pkg/protocol"
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
	var team tenancy.Limits
	fs.Int64Var(&team.MaxFile, "team-max-file", tenancy.DefaultTeamMaxFile, "bytes of file storage each team's account may use")
	fs.Int64Var(&team.MaxMemory, "team-max-mem", tenancy.DefaultTeamMaxMemory, "bytes of memory storage each team's account may use")
	fs.IntVar(&team.MaxStreams, "team-max-streams", tenancy.DefaultTeamMaxStreams, "streams each team's account may have")
	fs.IntVar(&team.MaxConsumers, "team-max-consumers", tenancy.DefaultTeamMaxConsumers, "consumers each team's account may have")
	fs.IntVar(&team.MaxAckPending, "team-max-ack-pending", tenancy.DefaultTeamMaxAckPending, "calls in flight each team's account may have")
	fs.IntVar(&team.MaxConnections, "team-max-connections", tenancy.DefaultTeamMaxConnections, "connections each team's account may have")
	fs.IntVar(&team.MaxSubscriptions, "team-max-subscriptions", tenancy.DefaultTeamMaxSubscriptions,
		"subscriptions each connection of a team may have (an executor uses 2 + 1 per function)")
	fs.IntVar(&team.MaxPayload, "team-max-payload", tenancy.DefaultTeamMaxPayload, "bytes of the largest message a team may publish")
	var control tenancy.ControlLimits
	fs.Int64Var(&control.MaxFile, "control-max-file", 0,
		"bytes of file storage the dispatchers' account may use, across replicas (0: replicas × ((teams+1) × result bytes + 4 GiB))")
	fs.Int64Var(&control.MaxMemory, "control-max-mem", tenancy.DefaultControlMaxMemory, "bytes of memory storage the dispatchers' account may use")
	fs.IntVar(&control.MaxStreams, "control-max-streams", 0, "streams the dispatchers' account may have (0: teams + 64)")
	fs.IntVar(&control.MaxConsumers, "control-max-consumers", tenancy.DefaultControlMaxConsumers, "consumers the dispatchers' account may have")
	resultBytes := fs.Int64("team-result-bytes", protocol.DefaultResultStreamBytes,
		"size of each team's result stream; written into dispatcher.env as TOOLRELAY_TEAM_RESULT_BYTES")
	maxPending := fs.Int64("max-pending", tenancy.DefaultMaxPending, "bytes a server buffers for a client that does not read before closing it")
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
		StoreDir: *store, Limits: team, Control: control, ResultBytes: *resultBytes, MaxPending: *maxPending,
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s (accounts.conf, %s)\n", *out, strings.Join(baseNames(res.Servers), ", "))
	if len(res.Created) > 0 {
		fmt.Fprintf(stdout, "new keys: %s (keep them secret; existing ones were kept)\n", strings.Join(res.Created, ", "))
	}
	fmt.Fprintf(stdout, "reserved:   %s of file and %s of memory storage across accounts; each server's JetStream must have that much (max_file_store, max_memory_store)\n",
		bytesText(res.ReservedFile), bytesText(res.ReservedMemory))
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

// bytesText is n in GiB or MiB, as an operator sizes a disk.
func bytesText(n int64) string {
	if n >= 1<<30 {
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	}
	return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
}
