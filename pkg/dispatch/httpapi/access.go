package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"path"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// toolsPath reports whether a ToolsOnly caller may ask for p.
func toolsPath(method, p string) bool {
	p = path.Clean("/" + p)
	return p == "/mcp" || p == "/v1/tools" && (method == http.MethodGet || method == http.MethodHead)
}

// Authenticator checks the bearer tokens of the HTTP API. Its methods are
// called for every guarded request, concurrently.
type Authenticator interface {
	// Authenticate returns the caller token belongs to, or false if no
	// token is known as it. It should compare in constant time.
	Authenticate(token string) (dispatch.Caller, bool)
}

// loopbackCaller is every client of a dispatcher without an Authenticator:
// only loopback clients get this far, and they see everything.
var loopbackCaller = dispatch.Caller{Name: "loopback", Admin: true}

type callerKey struct{}

// callerFrom returns the caller the guard found for the request of ctx; a
// request that did not pass the guard has none.
func callerFrom(ctx context.Context) (dispatch.Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(dispatch.Caller)
	return c, ok
}

// CallerOf returns the caller the guard found for r; a request that did
// not pass the guard has none and sees nothing.
func CallerOf(r *http.Request) dispatch.Caller {
	c, _ := callerFrom(r.Context())
	return c
}

// guarded reports whether requests for p need a caller: the API (/v1), the
// MCP front door (/mcp), the console (/ui) and, with GuardMetrics, /metrics
// (it names every team and function). Webhooks carry their own signature;
// /healthz, /readyz and by default /metrics are open.
func (a *Handler) guarded(p string) bool {
	p = path.Clean("/" + p)
	if p == "/metrics" {
		return a.opts.GuardMetrics
	}
	for _, prefix := range []string{"/v1", "/mcp", "/ui"} {
		if p == prefix || strings.HasPrefix(p, prefix+"/") {
			return true
		}
	}
	return false
}

// guard lets a request for a guarded path through only with a caller: a
// known bearer token (or the console's session cookie holding one) when the
// API has an Authenticator, a loopback client otherwise; a browser without
// one asking for a console page is sent to the login form. Without an
// Authenticator it first refuses, on every guarded path, what a web page
// made a browser on this host send (browser.go). The caller goes into the
// request's context for the handler to decide what it may see (403 or less
// detail).
func (a *Handler) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.guarded(r.URL.Path) {
			next.ServeHTTP(w, r) // open to all: nothing a page could read or change here
			return
		}
		if !a.checkBrowser(w, r) {
			return
		}
		if openConsolePath(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		caller, ambient, ok := a.authenticate(w, r)
		if !ok {
			return
		}
		if caller.ToolsOnly && !toolsPath(r.Method, r.URL.Path) {
			writeError(w, http.StatusForbidden, fmt.Sprintf("token %s may list and call the tools of its teams (%s) only: /mcp and GET /v1/tools",
				caller.Name, strings.Join(caller.Teams, ",")))
			return
		}
		if ambient && !formSafe(r) {
			writeError(w, http.StatusUnsupportedMediaType, "send the body as Content-Type: application/json: a request that changes something, "+
				"authenticated by the loopback address or the console's cookie, must be one a form of another site cannot send")
			return
		}
		if path.Clean("/"+r.URL.Path) == "/metrics" && !caller.Admin {
			writeError(w, http.StatusForbidden, fmt.Sprintf("token %s may not read /metrics: they name every team and function; "+
				"use an admin token, or serve them on their own address (TOOLRELAY_METRICS_ADDR)", caller.Name))
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, caller)))
	})
}

// authenticate finds the caller of r, or answers 401 and returns false.
// ambient reports that the caller was known by what a browser sends on
// its own (the loopback address, the console's cookie) rather than by an
// Authorization header.
func (a *Handler) authenticate(w http.ResponseWriter, r *http.Request) (_ dispatch.Caller, ambient, ok bool) {
	auth := a.opts.Authenticator
	if auth == nil {
		// The connection's own address: a header such as X-Forwarded-For
		// is whatever the client chose to send.
		if isLoopback(r.RemoteAddr) {
			return loopbackCaller, true, true
		}
		unauthorized(w, "", "this API serves loopback clients only; to serve others, give the dispatcher API tokens (TOOLRELAY_API_TOKENS_FILE)")
		return dispatch.Caller{}, false, false
	}
	token, ok := bearerToken(r.Header.Get("Authorization"))
	if !ok {
		token, ok = sessionToken(r) // the console's login cookie
		ambient = ok
	}
	if !ok {
		if !toLogin(w, r) {
			unauthorized(w, a.resourceChallenge(r), "missing bearer token: send Authorization: Bearer <token>")
		}
		return dispatch.Caller{}, false, false
	}
	caller, ok := auth.Authenticate(token)
	if !ok {
		a.log.WarnContext(r.Context(), "API request with an unknown bearer token refused", "remote", r.RemoteAddr, "path", r.URL.Path)
		if !toLogin(w, r) {
			unauthorized(w, `, error="invalid_token"`+a.resourceChallenge(r), "unknown bearer token")
		}
		return dispatch.Caller{}, false, false
	}
	return caller, ambient, true
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
