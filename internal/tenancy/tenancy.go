// Package tenancy writes the NATS server configuration of a toolrelay
// deployment with one account per team (dispatcher nats-config): accounts,
// NKEY users, the exports and imports that are the only paths between a
// team and the control plane, and the limits of each team's account and of
// the control account (limits.go). docs/security.md is the threat model it
// implements.
//
// Accounts:
//   - TOOLRELAY, the control plane: the dispatchers' user. Turn records,
//     timers, watches, the registry (claims and declarations) and each
//     team's result stream (FNRESULTS_<team>) live here.
//   - TEAM_<team>, one per team: its executors' user. Its call stream,
//     cancellations, dead letters and attempt marks live here, created by
//     its executors, bounded by the account's JetStream limits.
//   - SYS, the system account.
//
// Between a team and the control plane there are exactly these paths:
//
//	dispatcher → team   fncall.<team>.>      calls into the team's stream
//	                    fncancel.<team>.>    cancellations
//	team → dispatcher   fnresult.<team>.>    results, into FNRESULTS_<team>
//	                    toolrelay.declare.<team>   declarations (request/reply)
//	                    $JS.API.DIRECT.GET.FNRESULTS_<team>.>, imported as
//	                    $JS.toolrelay.API.DIRECT.GET.FNRESULTS_<team>.>
//	dispatcher reads    $JS.API.STREAM.INFO.FNCALLS_<team>     queue figures
//	the team's          $JS.API.CONSUMER.LIST.FNCALLS_<team>   (consumers' pending, ack pending)
//	                    $JS.API.STREAM.INFO.FNDLQ              dead letters: counts,
//	                    $JS.API.DIRECT.GET.FNDLQ[.>]           and the records
//	                    each imported as $JS.team.<team>.API.… (protocol.TeamAPIPrefixTemplate)
//
// The reads are JetStream API requests that change nothing: no request
// that writes, deletes, purges or creates a consumer, and nothing that
// reads FNCALLS_<team>'s messages (the calls' arguments) is exported. The
// dead-letter records do hold the calls' arguments and results: the
// operator console is there to show them. Replaying a dead letter
// publishes its call on fncall.<team>.<function>, the first path above.
//
// Each export names the one account that may import it, so no team can
// import another's subjects; inboxes, streams, mirrors, direct-get groups
// and message ids are per account, so nothing a team does in its own
// account reaches another's. It imports protocol (for the names) and nkeys.
package tenancy

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nkeys"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Account names.
const (
	ControlAccount = "TOOLRELAY"
	SystemAccount  = "SYS"
)

// TeamAccount is the account of team.
func TeamAccount(team string) string { return "TEAM_" + team }

// Options shape the generated configuration.
type Options struct {
	// Teams to give accounts (required; names as protocol.ValidateTeamName).
	Teams []string
	// Cluster is the number of nodes: 0 or 1 writes server.conf, 3 (or
	// more) n1.conf… for a cluster on the routes below.
	Cluster int
	// Host is the address clients and routes use. Default: 127.0.0.1.
	Host string
	// ClientPort is the first client port (node i listens on ClientPort+i-1).
	// Default: 4222.
	ClientPort int
	// ClusterPort is the first route port. Default: 6222.
	ClusterPort int
	// StoreDir is where node data goes (node i under StoreDir/n<i>).
	// Default: ./toolrelay-nats.
	StoreDir string
	// Limits of each team's account.
	Limits Limits
	// Control bounds the control account's JetStream use.
	Control ControlLimits
	// ResultBytes is the size of each team's result stream: written into
	// dispatcher.env (TOOLRELAY_TEAM_RESULT_BYTES), so the dispatchers
	// create what the control account's MaxFile was sized for. Default:
	// protocol.DefaultResultStreamBytes.
	ResultBytes int64
	// MaxPending bounds what a server buffers for one client connection
	// (every account's). Default: DefaultMaxPending (32 MiB).
	MaxPending int64
}

// Result says what Write wrote.
type Result struct {
	// Servers are the server configuration files, one per node.
	Servers []string
	// URL lists every node's client URL, for NATS_URL.
	URL string
	// Created lists the seed files made now (others were kept).
	Created []string
	// ReservedFile and ReservedMemory are the storage every account's
	// JetStream limits add up to. A server refuses JetStream to the
	// accounts beyond what its own max_file_store and max_memory_store
	// (by default 75% of the disk's free space and of the memory) hold.
	ReservedFile, ReservedMemory int64
}

// Write writes the configuration for opts into dir: accounts.conf, the
// server files, one NKEY seed per user (dispatcher.nk, <team>.nk, sys.nk,
// mode 0600) and one environment file per user (dispatcher.env,
// <team>.env) with NATS_URL, NATS_NKEY, TOOLRELAY_TEAM_API_PREFIX and
// TOOLRELAY_TEAM_RESULT_BYTES for the dispatcher and
// TOOLRELAY_CONTROL_API_PREFIX for teams, safe to source in
// a shell (see envFile; ReadEnvFile reads them back). Seeds already in dir
// are kept, so running it again with one more team leaves every existing
// credential valid.
func Write(dir string, opts Options) (*Result, error) {
	if len(opts.Teams) == 0 {
		return nil, errors.New("tenancy: no teams given")
	}
	teams := slices.Clone(opts.Teams)
	slices.Sort(teams)
	teams = slices.Compact(teams)
	for _, t := range teams {
		if err := protocol.ValidateTeamName(t); err != nil {
			return nil, fmt.Errorf("tenancy: %w", err)
		}
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.ClientPort == 0 {
		opts.ClientPort = 4222
	}
	if opts.ClusterPort == 0 {
		opts.ClusterPort = 6222
	}
	if opts.StoreDir == "" {
		opts.StoreDir = "./toolrelay-nats"
	}
	def(&opts.ResultBytes, protocol.DefaultResultStreamBytes)
	def(&opts.MaxPending, DefaultMaxPending)
	replicas := 1
	if opts.Cluster > 1 {
		replicas = 3 // what dispatcher.env's TOOLRELAY_REPLICAS says
	}
	opts.Limits = opts.Limits.withDefaults()
	opts.Control = opts.Control.withDefaults(len(teams), replicas, opts.ResultBytes)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("tenancy: %w", err)
	}
	res := &Result{
		ReservedFile:   opts.Control.MaxFile + int64(len(teams))*opts.Limits.MaxFile,
		ReservedMemory: opts.Control.MaxMemory + int64(len(teams))*opts.Limits.MaxMemory,
	}
	users := map[string]string{} // seed file stem → public key
	for _, stem := range append([]string{"sys", "dispatcher"}, teams...) {
		pub, created, err := userKey(filepath.Join(dir, stem+".nk"))
		if err != nil {
			return nil, err
		}
		if created {
			res.Created = append(res.Created, stem+".nk")
		}
		users[stem] = pub
	}
	if err := writeFile(filepath.Join(dir, "accounts.conf"), accounts(teams, users, opts), 0o644); err != nil {
		return nil, err
	}
	nodes := max(opts.Cluster, 1)
	var urls []string
	for i := 1; i <= nodes; i++ {
		urls = append(urls, fmt.Sprintf("nats://%s:%d", opts.Host, opts.ClientPort+i-1))
	}
	res.URL = strings.Join(urls, ",")
	for i := 1; i <= nodes; i++ {
		name := "server.conf"
		if nodes > 1 {
			name = fmt.Sprintf("n%d.conf", i)
		}
		if err := writeFile(filepath.Join(dir, name), server(i, nodes, opts), 0o644); err != nil {
			return nil, err
		}
		res.Servers = append(res.Servers, filepath.Join(dir, name))
	}
	env := func(stem string, more ...[2]string) error {
		abs, _ := filepath.Abs(filepath.Join(dir, stem+".nk"))
		vars := append([][2]string{{"NATS_URL", res.URL}, {"NATS_NKEY", abs}}, more...)
		if nodes > 1 {
			vars = append(vars, [2]string{"TOOLRELAY_REPLICAS", "3"})
		}
		return writeFile(filepath.Join(dir, stem+".env"), envFile(vars...), 0o600)
	}
	if err := env("dispatcher", [2]string{"TOOLRELAY_TEAM_API_PREFIX", protocol.TeamAPIPrefixTemplate},
		[2]string{"TOOLRELAY_TEAM_RESULT_BYTES", strconv.FormatInt(opts.ResultBytes, 10)}); err != nil {
		return nil, err
	}
	for _, t := range teams {
		if err := env(t, [2]string{"TOOLRELAY_CONTROL_API_PREFIX", protocol.ControlAPIPrefix}); err != nil {
			return nil, err
		}
	}
	return res, nil
}

// userKey returns the public key of the user seed in path, making the seed
// if there is none.
func userKey(path string) (pub string, created bool, err error) {
	seed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", false, fmt.Errorf("tenancy: make a key: %w", err)
		}
		if seed, err = kp.Seed(); err != nil {
			return "", false, err
		}
		if err := writeFile(path, string(seed)+"\n", 0o600); err != nil {
			return "", false, err
		}
		created = true
	} else if err != nil {
		return "", false, fmt.Errorf("tenancy: %w", err)
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return "", false, fmt.Errorf("tenancy: %s is not an NKEY user seed: %w", path, err)
	}
	pub, err = kp.PublicKey()
	return pub, created, err
}

func writeFile(path, body string, mode os.FileMode) error {
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		return fmt.Errorf("tenancy: %w", err)
	}
	return nil
}

// approvalAnnouncements are the subjects the dispatchers announce team's
// held calls and their decisions on (protocol.ApprovalRequestedSubject,
// ApprovalDecidedSubject): a team's chat bot listens in its own account,
// to its own calls only.
func approvalAnnouncements(team string) string { return protocol.ApprovalSubjectPrefix + ".*." + team }

const header = "# Generated by `dispatcher nats-config`; do not edit: run it again to add a team.\n"

func accounts(teams []string, users map[string]string, o Options) string {
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("# One account per team; the control plane (the dispatchers) in TOOLRELAY. See docs/security.md.\n\n")
	b.WriteString("accounts {\n")
	fmt.Fprintf(&b, "  %s: {\n    users: [ { nkey: %s } ]\n  }\n", SystemAccount, users["sys"])

	c := o.Control
	fmt.Fprintf(&b, "  %s: {\n", ControlAccount)
	fmt.Fprintf(&b, "    jetstream: { max_file: %d, max_mem: %d, max_streams: %d, max_consumers: %d }\n",
		c.MaxFile, c.MaxMemory, c.MaxStreams, c.MaxConsumers)
	fmt.Fprintf(&b, "    users: [ { nkey: %s } ]   # dispatcher.nk\n", users["dispatcher"])
	b.WriteString("    exports: [\n")
	for _, t := range teams {
		to := TeamAccount(t)
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", protocol.ResultSubjectPrefix+"."+t+".>", to)
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", protocol.DeclareSubject(t), to)
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", protocol.DefaultAPIPrefix+".DIRECT.GET."+protocol.ResultStream(t)+".>", to)
		fmt.Fprintf(&b, "      { stream: %q, accounts: [%s] }   # approval announcements of its calls\n", approvalAnnouncements(t), to)
	}
	b.WriteString("    ]\n    imports: [\n")
	for _, t := range teams {
		from := TeamAccount(t)
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %q } }\n", from, protocol.CallSubjectPrefix+"."+t+".>")
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %q } }\n", from, protocol.CancelSubjectPrefix+"."+t+".>")
		for _, api := range teamReads(t) {
			fmt.Fprintf(&b, "      { service: { account: %s, subject: %q }, to: %q }\n", from,
				protocol.DefaultAPIPrefix+"."+api, protocol.TeamAPIPrefix(protocol.TeamAPIPrefixTemplate, t)+"."+api)
		}
	}
	b.WriteString("    ]\n  }\n")

	l := o.Limits
	for _, t := range teams {
		fmt.Fprintf(&b, "  %s: {\n", TeamAccount(t))
		fmt.Fprintf(&b, "    jetstream: { max_file: %d, max_mem: %d, max_streams: %d, max_consumers: %d, max_ack_pending: %d }\n",
			l.MaxFile, l.MaxMemory, l.MaxStreams, l.MaxConsumers, l.MaxAckPending)
		fmt.Fprintf(&b, "    limits: { max_connections: %d, max_subscriptions: %d, max_payload: %d }   # subscriptions per connection\n",
			l.MaxConnections, l.MaxSubscriptions, l.MaxPayload)
		fmt.Fprintf(&b, "    users: [ { nkey: %s } ]   # %s.nk\n", users[t], t)
		b.WriteString("    exports: [\n")
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", protocol.CallSubjectPrefix+"."+t+".>", ControlAccount)
		fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", protocol.CancelSubjectPrefix+"."+t+".>", ControlAccount)
		for _, api := range teamReads(t) {
			fmt.Fprintf(&b, "      { service: %q, accounts: [%s] }\n", protocol.DefaultAPIPrefix+"."+api, ControlAccount)
		}
		b.WriteString("    ]\n    imports: [\n")
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %q } }\n", ControlAccount, protocol.ResultSubjectPrefix+"."+t+".>")
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %q } }\n", ControlAccount, protocol.DeclareSubject(t))
		fmt.Fprintf(&b, "      { stream: { account: %s, subject: %q } }\n", ControlAccount, approvalAnnouncements(t))
		get := ".DIRECT.GET." + protocol.ResultStream(t) + ".>"
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %q }, to: %q }\n", ControlAccount, protocol.DefaultAPIPrefix+get, protocol.ControlAPIPrefix+get)
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}\n")
	fmt.Fprintf(&b, "system_account: %s\n", SystemAccount)
	return b.String()
}

// teamReads are the JetStream API requests of team's account that the
// control account may make (under the team's TeamAPIPrefix), all
// read-only: the info of its call stream and of its dead-letter stream,
// the consumers of its call stream, and direct gets of its dead letters.
// Nothing here writes, deletes, creates a consumer or reads a call.
func teamReads(team string) []string {
	calls := protocol.CallStream(team)
	return []string{
		"STREAM.INFO." + calls,
		"CONSUMER.LIST." + calls,
		"STREAM.INFO." + protocol.DeadLetterStream,
		"DIRECT.GET." + protocol.DeadLetterStream,
		"DIRECT.GET." + protocol.DeadLetterStream + ".>",
	}
}

func server(i, nodes int, o Options) string {
	var b strings.Builder
	b.WriteString(header)
	fmt.Fprintf(&b, "server_name: toolrelay-%d\n", i)
	fmt.Fprintf(&b, "listen: %s:%d\n", o.Host, o.ClientPort+i-1)
	fmt.Fprintf(&b, "max_pending: %d   # bytes buffered for a client that does not read, then it is closed\n", o.MaxPending)
	store := o.StoreDir
	if nodes > 1 {
		store = filepath.Join(o.StoreDir, fmt.Sprintf("n%d", i))
	}
	b.WriteString("jetstream {\n")
	fmt.Fprintf(&b, "  store_dir: %q\n", store)
	b.WriteString("  sync_interval: always   # fsync every write: acknowledged writes survive a crash\n}\n")
	if nodes > 1 {
		b.WriteString("cluster {\n  name: toolrelay\n")
		fmt.Fprintf(&b, "  listen: %s:%d\n  routes: [\n", o.Host, o.ClusterPort+i-1)
		for j := 1; j <= nodes; j++ {
			fmt.Fprintf(&b, "    nats-route://%s:%d\n", o.Host, o.ClusterPort+j-1)
		}
		b.WriteString("  ]\n}\n")
	}
	b.WriteString("include \"accounts.conf\"\n")
	return b.String()
}
