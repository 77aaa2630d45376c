package tenancy_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/tenancy"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The server takes the generated configuration, and each account carries
// the limits asked for: the defaults, or each one tuned.
func TestLimitsInGeneratedConfig(t *testing.T) {
	const teams = 2
	for _, tc := range []struct {
		name        string
		opts        tenancy.Options
		control     server.JetStreamAccountLimits
		team        server.JetStreamAccountLimits
		conns, subs int
		payload     int64
	}{{
		name: "defaults",
		control: server.JetStreamAccountLimits{MaxMemory: tenancy.DefaultControlMaxMemory,
			MaxStore:   (teams+1)*protocol.DefaultResultStreamBytes + tenancy.DefaultControlStateBytes,
			MaxStreams: teams + tenancy.DefaultControlStreamsSpare, MaxConsumers: tenancy.DefaultControlMaxConsumers,
			MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1},
		team: server.JetStreamAccountLimits{MaxMemory: tenancy.DefaultTeamMaxMemory, MaxStore: tenancy.DefaultTeamMaxFile,
			MaxStreams: tenancy.DefaultTeamMaxStreams, MaxConsumers: tenancy.DefaultTeamMaxConsumers,
			MaxAckPending: tenancy.DefaultTeamMaxAckPending, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1},
		conns: tenancy.DefaultTeamMaxConnections, subs: tenancy.DefaultTeamMaxSubscriptions, payload: tenancy.DefaultTeamMaxPayload,
	}, {
		name: "tuned",
		opts: tenancy.Options{
			Limits: tenancy.Limits{MaxFile: 5 << 20, MaxMemory: 1 << 20, MaxStreams: 3, MaxConsumers: 7, MaxAckPending: 11,
				MaxConnections: 13, MaxSubscriptions: 17, MaxPayload: 64 << 10},
			Control:     tenancy.ControlLimits{MaxMemory: 2 << 20, MaxStreams: 19, MaxConsumers: 23},
			ResultBytes: 1 << 20,
		},
		control: server.JetStreamAccountLimits{MaxMemory: 2 << 20, MaxStore: (teams+1)*(1<<20) + tenancy.DefaultControlStateBytes,
			MaxStreams: 19, MaxConsumers: 23, MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1},
		team: server.JetStreamAccountLimits{MaxMemory: 1 << 20, MaxStore: 5 << 20, MaxStreams: 3, MaxConsumers: 7,
			MaxAckPending: 11, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1},
		conns: 13, subs: 17, payload: 64 << 10,
	}, {
		name:    "control storage given",
		opts:    tenancy.Options{Control: tenancy.ControlLimits{MaxFile: 3 << 30}},
		control: server.JetStreamAccountLimits{MaxMemory: tenancy.DefaultControlMaxMemory, MaxStore: 3 << 30, MaxStreams: teams + tenancy.DefaultControlStreamsSpare, MaxConsumers: tenancy.DefaultControlMaxConsumers, MaxAckPending: -1, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1},
		team: server.JetStreamAccountLimits{MaxMemory: tenancy.DefaultTeamMaxMemory, MaxStore: tenancy.DefaultTeamMaxFile,
			MaxStreams: tenancy.DefaultTeamMaxStreams, MaxConsumers: tenancy.DefaultTeamMaxConsumers,
			MaxAckPending: tenancy.DefaultTeamMaxAckPending, MemoryMaxStreamBytes: -1, StoreMaxStreamBytes: -1},
		conns: tenancy.DefaultTeamMaxConnections, subs: tenancy.DefaultTeamMaxSubscriptions, payload: tenancy.DefaultTeamMaxPayload,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			tc.opts.Teams = []string{"orders", "billing"}
			res, err := tenancy.Write(dir, tc.opts)
			if err != nil {
				t.Fatal(err)
			}
			if want := tc.control.MaxStore + teams*tc.team.MaxStore; res.ReservedFile != want {
				t.Errorf("ReservedFile %d, want %d", res.ReservedFile, want)
			}
			srv := start(t, res.Servers[0])
			for account, want := range map[string]server.JetStreamAccountLimits{
				tenancy.ControlAccount: tc.control, tenancy.TeamAccount("orders"): tc.team, tenancy.TeamAccount("billing"): tc.team,
			} {
				acc, err := srv.LookupAccount(account)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(want, acc.JetStreamUsage().Limits); diff != "" {
					t.Errorf("%s's JetStream limits (-want +got):\n%s", account, diff)
				}
				if account != tenancy.ControlAccount && acc.MaxActiveConnections() != tc.conns {
					t.Errorf("%s's connections: %d, want %d", account, acc.MaxActiveConnections(), tc.conns)
				}
			}

			// A team's connection may publish its payload limit, and is
			// closed for more (the greeting's max_payload is the server's;
			// the account's is enforced after it), and is refused its
			// subscription past the limit.
			if err := payloadLimit(t, srv, filepath.Join(dir, "orders.nk"), tc.payload); err != nil {
				t.Error(err)
			}
			errs := make(chan error, 1)
			auth, err := nats.NkeyOptionFromSeed(filepath.Join(dir, "orders.nk"))
			if err != nil {
				t.Fatal(err)
			}
			nc, err := nats.Connect(srv.ClientURL(), auth, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case errs <- err:
				default:
				}
			}))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			for i := range tc.subs {
				if _, err := nc.SubscribeSync(fmt.Sprint("s.", i)); err != nil {
					t.Fatal(err)
				}
			}
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-errs:
				t.Fatalf("%d subscriptions: %v, want them taken", tc.subs, err)
			default:
			}
			if _, err := nc.SubscribeSync("one.more"); err != nil {
				t.Fatal(err)
			}
			_ = nc.Flush()
			select {
			case err := <-errs:
				if !errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
					t.Errorf("subscription %d: %v, want nats.ErrMaxSubscriptionsExceeded", tc.subs+1, err)
				}
			case <-time.After(5 * time.Second):
				t.Errorf("subscription %d: taken, want nats.ErrMaxSubscriptionsExceeded", tc.subs+1)
			}
		})
	}
}

// On a cluster the control account's storage counts each of the three
// replicas, and every node's file parses.
func TestControlLimitsOnACluster(t *testing.T) {
	dir := t.TempDir()
	res, err := tenancy.Write(dir, tenancy.Options{Teams: []string{"orders", "billing"}, Cluster: 3})
	if err != nil {
		t.Fatal(err)
	}
	control := int64(3 * (3*protocol.DefaultResultStreamBytes + tenancy.DefaultControlStateBytes))
	if want := control + 2*tenancy.DefaultTeamMaxFile; res.ReservedFile != want {
		t.Errorf("ReservedFile %d, want %d (the control account's %d across 3 replicas)", res.ReservedFile, want, control)
	}
	for _, f := range res.Servers {
		opts, err := server.ProcessConfigFile(f)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if opts.MaxPending != tenancy.DefaultMaxPending {
			t.Errorf("%s: max_pending %d, want %d", f, opts.MaxPending, tenancy.DefaultMaxPending)
		}
	}
}

// payloadLimit checks that a connection with the seed in nk may publish
// limit bytes and no more.
func payloadLimit(t *testing.T, srv *server.Server, nk string, limit int64) error {
	t.Helper()
	auth, err := nats.NkeyOptionFromSeed(nk)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL(), auth, nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("p", make([]byte, limit)); err != nil {
		return fmt.Errorf("publishing %d bytes: %w", limit, err)
	}
	if err := nc.Flush(); err != nil {
		return fmt.Errorf("publishing %d bytes: %w", limit, err)
	}
	err = nc.Publish("p", make([]byte, limit+1))
	if err == nil {
		err = nc.Flush()
	}
	if errors.Is(err, nats.ErrMaxPayload) || (nc.LastError() != nil && strings.Contains(nc.LastError().Error(), "maximum payload violation")) {
		return nil
	}
	return fmt.Errorf("publishing %d bytes: %v, last error %v; want a payload violation", limit+1, err, nc.LastError())
}

// start runs a server on the configuration file conf, on a free port and a
// temporary store.
func start(t *testing.T, conf string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("the server refuses %s: %v", conf, err)
	}
	opts.Port, opts.StoreDir, opts.NoLog, opts.NoSigs = -1, t.TempDir(), true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	return srv
}

// A server reserves every account's memory and file limits when it enables
// JetStream for it, and refuses JetStream altogether when they add up to
// more than its own max_memory_store or max_file_store (75% of the memory
// and of the free disk by default). Nothing of toolrelay stores in memory,
// so the teams' memory limits must not be what stops a server of ordinary
// size from hosting 300 teams.
func TestManyTeamsFitAServersMemory(t *testing.T) {
	teams := make([]string, 300)
	for i := range teams {
		teams[i] = fmt.Sprintf("t%03d", i)
	}
	res, err := tenancy.Write(t.TempDir(), tenancy.Options{Teams: teams})
	if err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(res.Servers[0])
	if err != nil {
		t.Fatal(err)
	}
	// A server with 1 GiB for memory storage; the disk is not what is
	// looked at here.
	opts.Port, opts.StoreDir, opts.NoLog, opts.NoSigs = -1, t.TempDir(), true, true
	opts.JetStreamMaxMemory, opts.JetStreamMaxStore = 1<<30, 1<<50
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(30*time.Second) || !srv.JetStreamEnabled() {
		t.Fatalf("the server did not start JetStream for 300 teams, which reserve %d MiB of memory storage", res.ReservedMemory>>20)
	}
	for _, team := range teams {
		if acc, err := srv.LookupAccount(tenancy.TeamAccount(team)); err != nil || !acc.JetStreamEnabled() {
			t.Fatalf("team %s: JetStream not enabled (%v)", team, err)
		}
	}
}
