package httpapi

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// DefaultMCPCallTimeout is the default of [Options.MCPCallTimeout].
const DefaultMCPCallTimeout = 60 * time.Second

// Options configures a [Handler]. The zero value is valid.
type Options struct {
	// Logger receives the API's logs. Default: slog.Default().
	Logger *slog.Logger
	// Authenticator, if set, checks the bearer tokens that /v1 (and /mcp
	// and /ui) need, and says which teams each caller sees. Nil: those
	// routes serve loopback clients only, who see everything.
	Authenticator Authenticator
	// MCPCallTimeout caps how long a tools/call on /mcp may run: its
	// deadline is the function's own timeout, or this if that is longer or
	// unset. MCP clients wait on an open HTTP request, so this is shorter
	// than the dispatcher's RunTTL. Default: DefaultMCPCallTimeout (60s).
	MCPCallTimeout time.Duration
	// TracerProvider receives the spans of MCP tools/call requests.
	// Default: the OpenTelemetry global.
	TracerProvider trace.TracerProvider
	// MaxStreamsPerCaller bounds the event streams one caller (a token, or
	// every loopback client together) holds open at once: GET
	// /v1/turns/stream and MCP subscriptions/listen. One more is refused
	// (429, or a JSON-RPC error). Default: DefaultMaxStreamsPerCaller (16).
	MaxStreamsPerCaller int
	// MaxMCPCallsPerCaller bounds the tools/call one caller has running at
	// once on /mcp; one more fails at once as unavailable (isError, saying
	// why). It bounds, apart, the MCP tasks one caller has running across
	// the fleet; one more is a JSON-RPC error. Default:
	// DefaultMaxMCPCallsPerCaller (64).
	MaxMCPCallsPerCaller int
	// Timeouts are the listener's (give the same to [NewServer]): the API
	// bounds each write of an event stream by Timeouts.Write. Zero fields:
	// the defaults.
	Timeouts Timeouts
	// Metrics, if set, is served at GET /metrics: open, as /healthz is,
	// unless GuardMetrics. Nil: the API does not serve /metrics (serve it
	// on an address of its own).
	Metrics http.Handler
	// PublicURL is the API's address as its clients reach it
	// (https://tools.example.com; see [CheckPublicURL]): with an
	// Authenticator, the OAuth protected-resource metadata names /mcp under
	// it. Empty: each request's own scheme and Host.
	PublicURL string
	// AuthorizationServers are the issuer URLs of the OAuth authorization
	// servers whose tokens reach /mcp, listed in its protected-resource
	// metadata for MCP clients to discover. The dispatcher does not check
	// their tokens: a proxy in front must (docs/security.md). Empty: none
	// listed, and clients need a toolrelay token given to them.
	AuthorizationServers []string
	// GuardMetrics puts /metrics behind the guard: admin tokens only, or
	// loopback clients without tokens (the metrics name every team and
	// function). Default: open.
	GuardMetrics bool
}

// Handler serves the dispatcher's HTTP API (see the package doc). It is
// safe for concurrent use.
type Handler struct {
	d      *dispatch.Dispatcher
	opts   Options
	log    *slog.Logger
	tracer trace.Tracer
	h      http.Handler
	// streams and mcpCalls count what each caller holds at once.
	streams, mcpCalls *perCaller
}

var _ http.Handler = (*Handler)(nil)

// New returns the HTTP API of d.
func New(d *dispatch.Dispatcher, opts Options) *Handler {
	opts.Logger = cmp.Or(opts.Logger, slog.Default())
	opts.MCPCallTimeout = cmp.Or(max(opts.MCPCallTimeout, 0), DefaultMCPCallTimeout)
	opts.MaxStreamsPerCaller = cmp.Or(max(opts.MaxStreamsPerCaller, 0), DefaultMaxStreamsPerCaller)
	opts.MaxMCPCallsPerCaller = cmp.Or(max(opts.MaxMCPCallsPerCaller, 0), DefaultMaxMCPCallsPerCaller)
	opts.Timeouts = opts.Timeouts.orDefaults()
	if opts.TracerProvider == nil {
		opts.TracerProvider = otel.GetTracerProvider()
	}
	a := &Handler{d: d, opts: opts, log: opts.Logger, tracer: opts.TracerProvider.Tracer(instrumentation),
		streams: newPerCaller(opts.MaxStreamsPerCaller), mcpCalls: newPerCaller(opts.MaxMCPCallsPerCaller)}
	mux := http.NewServeMux()
	if opts.Metrics != nil {
		mux.Handle("GET /metrics", opts.Metrics) // the guard decides, per GuardMetrics
	}
	mux.HandleFunc("POST /v1/watch", a.postWatch)
	mux.HandleFunc("GET /v1/watch/{id}", a.getWatch)
	mux.HandleFunc("POST /webhooks/openai", a.postWebhook)
	mux.Handle("/mcp", a.mcpHandler())
	mux.HandleFunc(wellKnownResource, a.protectedResource)
	mux.HandleFunc(wellKnownResource+"/mcp", a.protectedResource)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !d.Ready() || !d.Connected() {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	a.routeInspect(mux)
	a.routeApprovals(mux)
	a.h = a.guard(a.whenReady(mux))
	return a
}

// instrumentation names the tracer of the API's spans.
const instrumentation = "github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"

// ServeHTTP serves the API.
func (a *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.h.ServeHTTP(w, r) }

// whenReady answers 503 (with Retry-After) to every request but the health
// checks, /metrics and the OAuth metadata (which need no JetStream) until
// the dispatcher is ready: before that the streams and
// buckets the handlers use may not be provisioned yet (JetStream still
// electing its leaders), and after it stops they are no longer served.
func (a *Handler) whenReady(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.d.Ready() && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" && r.URL.Path != "/metrics" &&
			!strings.HasPrefix(r.URL.Path, "/.well-known/") {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{
				"message": "the dispatcher is starting or stopping; try again in a moment"}})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// maxWatchBody bounds a POST /v1/watch body: a reference to a platform
// object and a little metadata.
const maxWatchBody = 64 << 10

func (a *Handler) postWatch(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWatchBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than the %d KiB a watch request may be", maxWatchBody>>10))
		return
	}
	if err != nil {
		writeFieldError(w, &dispatch.FieldError{Message: "could not read the body"})
		return
	}
	// A traceparent on the request makes the watch's turns its children.
	ctx := otelconv.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	status, reply := a.d.AnswerWatchRequest(ctx, body)
	writeJSON(w, status, reply)
}

// getWatch answers GET /v1/watch/{id}. A caller scoped to teams sees other
// teams' calls without their results, and gets 403 for a watch that calls
// none of its teams' functions.
func (a *Handler) getWatch(w http.ResponseWriter, r *http.Request) {
	status, reply := a.d.AnswerWatchStatus(r.Context(), CallerOf(r), r.PathValue("id"))
	writeJSON(w, status, reply)
}

func fieldErrorBody(fe *dispatch.FieldError) any {
	body := map[string]any{"message": strings.TrimPrefix(fe.Message, "dispatch: ")}
	if fe.Field != "" {
		body["field"] = fe.Field
	}
	return map[string]any{"error": body}
}

func writeFieldError(w http.ResponseWriter, fe *dispatch.FieldError) {
	writeJSON(w, http.StatusBadRequest, fieldErrorBody(fe))
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, map[string]any{"error": map[string]any{"message": message}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
