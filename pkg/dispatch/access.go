package dispatch

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"
)

// Caller is who a request to the HTTP API comes from and what it may see.
type Caller struct {
	// Name identifies the caller in logs: the name of its token, or
	// "loopback" when no Authenticator is set.
	Name string
	// Admin callers see everything.
	Admin bool
	// Teams are what a caller that is not an admin may see: the functions
	// of these teams, their calls and results.
	Teams []string
	// ToolsOnly callers may list and call the tools of Teams (/mcp and
	// GET /v1/tools) and reach nothing else: the scope to give an agent,
	// which needs its tools, not the calls and dead letters of their teams.
	ToolsOnly bool
}

// toolsPath reports whether a ToolsOnly caller may ask for p.
func toolsPath(method, p string) bool {
	p = path.Clean("/" + p)
	return p == "/mcp" || p == "/v1/tools" && (method == http.MethodGet || method == http.MethodHead)
}

// Sees reports whether c may see what belongs to team.
func (c Caller) Sees(team string) bool {
	return c.Admin || slices.Contains(c.Teams, team)
}

// LogValue shows the caller's name and scope, never a credential.
func (c Caller) LogValue() slog.Value {
	scope := "admin"
	switch {
	case c.ToolsOnly:
		scope = "tools:" + strings.Join(c.Teams, ",")
	case !c.Admin:
		scope = "teams:" + strings.Join(c.Teams, ",")
	}
	return slog.GroupValue(slog.String("name", c.Name), slog.String("scope", scope))
}

// Authenticator checks the bearer tokens of the HTTP API. Its methods are
// called for every guarded request, concurrently.
type Authenticator interface {
	// Authenticate returns the caller token belongs to, or false if no
	// token is known as it. It should compare in constant time.
	Authenticate(token string) (Caller, bool)
}

// loopbackCaller is every client of a dispatcher without an Authenticator:
// only loopback clients get this far, and they see everything.
var loopbackCaller = Caller{Name: "loopback", Admin: true}

type callerKey struct{}

// callerFrom returns the caller guard found for the request of ctx.
func callerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// guarded reports whether requests for p need a caller: the API (/v1), the
// MCP front door (/mcp) and the console (/ui). Webhooks carry their own
// signature; /healthz, /readyz and /metrics are open.
func guarded(p string) bool {
	p = path.Clean("/" + p)
	for _, prefix := range []string{"/v1", "/mcp", "/ui"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// guard lets a request for a guarded path through only with a caller: a
// known bearer token (or the console's session cookie holding one) when d
// has an Authenticator, a loopback client otherwise; a browser without one
// asking for a console page is sent to the login form. The caller goes into the request's context for the handler to
// decide what it may see (403 or less detail).
func (d *Dispatcher) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !guarded(r.URL.Path) || openConsolePath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		caller, ok := d.authenticate(w, r)
		if !ok {
			return
		}
		if caller.ToolsOnly && !toolsPath(r.Method, r.URL.Path) {
			writeError(w, http.StatusForbidden, fmt.Sprintf("token %s may list and call the tools of its teams (%s) only: /mcp and GET /v1/tools",
				caller.Name, strings.Join(caller.Teams, ",")))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
	})
}

// authenticate finds the caller of r, or answers 401 and returns false.
func (d *Dispatcher) authenticate(w http.ResponseWriter, r *http.Request) (Caller, bool) {
	auth := d.opts.Authenticator
	if auth == nil {
		// The connection's own address: a header such as X-Forwarded-For
		// is whatever the client chose to send.
		if isLoopback(r.RemoteAddr) {
			return loopbackCaller, true
		}
		unauthorized(w, "", "this API serves loopback clients only; to serve others, give the dispatcher API tokens (TOOLRELAY_API_TOKENS_FILE)")
		return Caller{}, false
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		token, ok = sessionToken(r) // the console's login cookie
	}
	if !ok {
		if !toLogin(w, r) {
			unauthorized(w, "", "missing bearer token: send Authorization: Bearer <token>")
		}
		return Caller{}, false
	}
	caller, ok := auth.Authenticate(token)
	if !ok {
		d.log.WarnContext(r.Context(), "API request with an unknown bearer token refused", "remote", r.RemoteAddr, "path", r.URL.Path)
		if !toLogin(w, r) {
			unauthorized(w, `, error="invalid_token"`, "unknown bearer token")
		}
		return Caller{}, false
	}
	return caller, true
}

// unauthorized answers 401 with the challenge of RFC 6750 (plus params)
// and the API's JSON error body.
func unauthorized(w http.ResponseWriter, params, message string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="toolrelay"`+params)
	writeError(w, http.StatusUnauthorized, message)
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// header (the scheme is case-insensitive, as RFC 9110 says).
func bearerToken(header string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(header), " ")
	token = strings.TrimSpace(token)
	if !ok || !strings.EqualFold(scheme, "Bearer") || token == "" {
		return "", false
	}
	return token, true
}

// isLoopback reports whether addr (host:port, as in http.Request.RemoteAddr)
// is in 127.0.0.0/8 or is ::1 (IPv4-mapped forms included).
func isLoopback(addr string) bool {
	ap, err := netip.ParseAddrPort(addr)
	return err == nil && ap.Addr().Unmap().IsLoopback()
}
