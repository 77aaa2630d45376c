package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	neturl "net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
)

// ConnectOptions configures [Connect]. The zero value is valid.
type ConnectOptions struct {
	// Name of the connection, as the server's monitoring shows it.
	// Default: "toolrelay-executor".
	Name string
	// Logger receives the retries while the servers are not up yet, and
	// each disconnect and reconnect. Default: slog.Default().
	Logger *slog.Logger
	// NATS are further options for nats.Connect (credentials, TLS, ...),
	// applied after Connect's own, so they may override them.
	NATS []nats.Option
}

// ErrBadURL reports a NATS server URL Connect cannot use however long it
// waits: a typo, not a server that is down.
var ErrBadURL = errors.New("exec: malformed NATS URL")

// checkServerURLs refuses a server list with an entry that is not a NATS
// URL, such as nats//host:4222: the client would take "nats" for a host
// name and retry its DNS lookup for ever.
func checkServerURLs(list string) error {
	for _, s := range strings.Split(list, ",") {
		s = strings.TrimSpace(s)
		bad := func(why string) error {
			return fmt.Errorf("%w %q: %s; want nats://host:port (several separated by commas)", ErrBadURL, s, why)
		}
		if s == "" {
			return bad("empty")
		}
		if !strings.Contains(s, "://") {
			if strings.Contains(s, "/") {
				return bad(`it has a "/" but no "://"`)
			}
			s = "nats://" + s
		}
		u, err := neturl.Parse(s)
		if err != nil {
			return bad(err.Error())
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			return bad(fmt.Sprintf("unknown scheme %q", u.Scheme))
		}
		if u.Hostname() == "" {
			return bad("no host")
		}
		if p := u.Port(); p != "" {
			if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
				return bad(fmt.Sprintf("port %q is not a number from 1 to 65535", p))
			}
		}
		if u.Path != "" && u.Path != "/" {
			return bad(fmt.Sprintf("unexpected path %q", u.Path))
		}
	}
	return nil
}

// connectMaxBackoff caps the wait between attempts to reach servers that
// are not up yet; the first wait is 100ms and each one doubles.
const connectMaxBackoff = 5 * time.Second

// Connect connects to the NATS servers at url (comma-separated) for a
// long-running process such as an executor, and returns the connection
// and its JetStream handle. Servers that are not up yet (started at the
// same time, or restarting) are retried with backoff until ctx ends, so a
// process started before NATS waits instead of exiting; once connected it
// reconnects forever, logging each disconnect and reconnect. Every failure
// to connect is retried (bad credentials too, logged each time), so the
// error it returns is that ctx ended first, wrapping the last connection
// error and ctx's cause — except a url that is not a list of NATS URLs
// (nats//host:4222, say), refused at once with [ErrBadURL]. Close the
// connection when done.
func Connect(ctx context.Context, url string, opts ConnectOptions) (*nats.Conn, jetstream.JetStream, error) {
	if err := checkServerURLs(url); err != nil {
		return nil, nil, err
	}
	if opts.Name == "" {
		opts.Name = "toolrelay-executor"
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	nopts := append([]nats.Option{
		nats.Name(opts.Name), nats.MaxReconnects(-1), nats.ReconnectWait(time.Second),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) { log.Info("reconnected to NATS", "url", c.ConnectedUrlRedacted()) }),
	}, opts.NATS...)
	retry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: connectMaxBackoff}
	for {
		nc, err := nats.Connect(url, nopts...)
		if err == nil {
			js, err := jetstream.New(nc)
			if err != nil {
				nc.Close()
				return nil, nil, fmt.Errorf("exec: jetstream on %s: %w", url, err)
			}
			return nc, js, nil
		}
		wait := retry.Next()
		log.Warn("NATS not reachable yet; retrying (is a dispatcher with its embedded server, or nats-server, listening there? NATS_URL names it)",
			"url", url, "err", err, "in", wait.String())
		if !backoff.Sleep(ctx, wait) {
			return nil, nil, fmt.Errorf("exec: connect to NATS at %s: %w (gave up: %w)", url, err, context.Cause(ctx))
		}
	}
}
