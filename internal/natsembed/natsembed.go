// Package natsembed runs a JetStream-enabled nats-server inside the process:
// the default when NATS_URL is empty, and the server of the tests.
//
// It may import only nats-server; the dispatcher command, the demo and
// internal/natstest use it.
package natsembed

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Options configures an embedded server. The zero value listens on a random
// loopback port and stores in a directory the caller must set.
type Options struct {
	// Listen is host:port for clients. Port 0 picks a free port.
	// Default: "127.0.0.1:0".
	Listen string
	// StoreDir is where JetStream keeps its files. Required.
	StoreDir string
	// Name is the server name. Default: "toolrelay".
	Name string
	// SyncAlways fsyncs every write; slower, but survives power loss.
	// Default: false (the server's periodic sync).
	SyncAlways bool
	// Logger receives the server's log at Debug level; nil discards it.
	Logger *slog.Logger
	// ReadyTimeout bounds the wait for the server to accept clients.
	// Default: 10s.
	ReadyTimeout time.Duration
}

// Start starts the server and waits until it accepts connections. The caller
// owns the server and must call Shutdown.
func Start(opts Options) (*server.Server, error) {
	if opts.StoreDir == "" {
		return nil, errors.New("natsembed: StoreDir is required")
	}
	listen := opts.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("natsembed: listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("natsembed: listen address %q: bad port", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	} else if err := portFree(listen); err != nil {
		return nil, err
	}
	name := opts.Name
	if name == "" {
		name = "toolrelay"
	}
	sopts := &server.Options{
		ServerName: name,
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   opts.StoreDir,
		SyncAlways: opts.SyncAlways,
		NoSigs:     true,
		NoLog:      opts.Logger == nil,
	}
	s, err := server.NewServer(sopts)
	if err != nil {
		return nil, fmt.Errorf("natsembed: %w", err)
	}
	if opts.Logger != nil {
		s.SetLoggerV2(&slogAdapter{l: opts.Logger}, false, false, false)
	}
	go s.Start()
	timeout := opts.ReadyTimeout
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	if !s.ReadyForConnections(timeout) {
		s.Shutdown()
		return nil, fmt.Errorf("natsembed: server on %s not ready after %s (is the port in use?)", listen, timeout)
	}
	return s, nil
}

// portFree fails at once if another process holds listen: the server
// would only log that and never become ready, and the caller would wait
// out the ready timeout (a restart racing the old process's shutdown, a
// second dispatcher on one host).
// ErrPortTaken: the embedded server's client address is in use.
var ErrPortTaken = errors.New("the embedded JetStream server cannot listen")

func portFree(listen string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("%w on %s: %w", ErrPortTaken, listen, err)
	}
	return ln.Close()
}

// slogAdapter forwards the server's log lines to slog.
type slogAdapter struct{ l *slog.Logger }

func (a *slogAdapter) Noticef(format string, v ...any) { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Warnf(format string, v ...any)   { a.l.Warn(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Fatalf(format string, v ...any)  { a.l.Error(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Errorf(format string, v ...any)  { a.l.Error(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Debugf(format string, v ...any)  { a.l.Debug(fmt.Sprintf(format, v...)) }
func (a *slogAdapter) Tracef(format string, v ...any)  {}
