package httpapi

import (
	"cmp"
	"net/http"
	"time"
)

// Default timeouts of a listener (see [Timeouts]).
const (
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultReadTimeout       = 30 * time.Second
	DefaultWriteTimeout      = 60 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
)

// Timeouts bound how long a client may hold a connection without making
// progress. A zero field takes its default; a negative one means none.
type Timeouts struct {
	// ReadHeader bounds reading a request's line and headers.
	// Default: DefaultReadHeaderTimeout (10s).
	ReadHeader time.Duration
	// Read bounds reading a whole request, headers and body: a client
	// that sends its body slowly is cut off. Default: DefaultReadTimeout (30s).
	Read time.Duration
	// Write bounds writing an answer, from the end of its request. Event
	// streams (GET /v1/turns/stream, the answers of /mcp) are not bounded
	// as a whole: each of their writes gets this long instead, so a
	// client that stops reading is cut off. Default: DefaultWriteTimeout (60s).
	Write time.Duration
	// Idle bounds how long a kept-alive connection waits for its next
	// request. Default: DefaultIdleTimeout (60s).
	Idle time.Duration
}

// orDefaults returns t with each zero field at its default and each
// negative one at zero (none, for net/http).
func (t Timeouts) orDefaults() Timeouts {
	pick := func(v, def time.Duration) time.Duration { return max(cmp.Or(v, def), 0) }
	return Timeouts{
		ReadHeader: pick(t.ReadHeader, DefaultReadHeaderTimeout),
		Read:       pick(t.Read, DefaultReadTimeout),
		Write:      pick(t.Write, DefaultWriteTimeout),
		Idle:       pick(t.Idle, DefaultIdleTimeout),
	}
}

// NewServer returns a server of h bounded by t. Every listener of the
// dispatcher's commands is one: the API's, the metrics', the platform
// simulator's (which streams, so it is given no write timeout).
func NewServer(h http.Handler, t Timeouts) *http.Server {
	t = t.orDefaults()
	return &http.Server{Handler: h, ReadHeaderTimeout: t.ReadHeader, ReadTimeout: t.Read, WriteTimeout: t.Write, IdleTimeout: t.Idle}
}

// streamWriter gives each write of a long answer its own deadline, in place
// of the server's deadline for the whole answer: an event stream may last
// as long as its client reads it.
type streamWriter struct {
	http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration // 0: no deadline
}

// streaming returns w for a long answer (see streamWriter).
func (a *Handler) streaming(w http.ResponseWriter) http.ResponseWriter {
	sw := &streamWriter{ResponseWriter: w, rc: http.NewResponseController(w), timeout: a.opts.Timeouts.Write}
	sw.extend()
	return sw
}

func (s *streamWriter) extend() {
	var deadline time.Time
	if s.timeout > 0 {
		deadline = time.Now().Add(s.timeout)
	}
	_ = s.rc.SetWriteDeadline(deadline) // unsupported: the server's own deadline stays
}

func (s *streamWriter) Write(p []byte) (int, error) {
	s.extend()
	return s.ResponseWriter.Write(p)
}

func (s *streamWriter) FlushError() error {
	s.extend()
	return s.rc.Flush()
}

func (s *streamWriter) Flush() { _ = s.FlushError() }

// Unwrap lets http.ResponseController reach the connection's writer.
func (s *streamWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }
