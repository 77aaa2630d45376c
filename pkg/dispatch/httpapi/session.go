package httpapi

import (
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// A browser cannot send a bearer token when it navigates, so the console
// accepts the token once, in its login form, and keeps it in a cookie the
// guard reads like an Authorization header: SessionCookie, HttpOnly (no
// script reads it), SameSite=Strict (no other site's page sends it), Path=/
// (the console's pages and the /v1 API its scripts read).
const SessionCookie = "toolrelay_session"

// Guard lets a request through to h only with a caller, as the Handler
// does for its own routes: for handlers served beside it (the console) on
// the same paths' rules. The caller is read with CallerOf.
func (a *Handler) Guard(h http.Handler) http.Handler { return a.guard(h) }

// TokensRequired reports whether the API needs bearer tokens (an
// Authenticator is set); without, it serves loopback clients only.
func (a *Handler) TokensRequired() bool { return a.opts.Authenticator != nil }

// CheckToken returns the caller of a bearer token, or false if it is not
// known (or the API takes no tokens).
func (a *Handler) CheckToken(token string) (dispatch.Caller, bool) {
	if a.opts.Authenticator == nil || token == "" {
		return dispatch.Caller{}, false
	}
	return a.opts.Authenticator.Authenticate(token)
}

// sessionToken returns the token of r's session cookie.
func sessionToken(r *http.Request) (string, bool) {
	c, err := r.Cookie(SessionCookie)
	if err != nil || c.Value == "" {
		return "", false
	}
	return c.Value, true
}

// openConsolePath reports whether p is a part of the console every
// client may load: the login form and the static files it needs.
func openConsolePath(p string) bool {
	p = path.Clean("/" + p)
	return p == "/ui/login" || strings.HasPrefix(p, "/ui/static/")
}

// toLogin sends a browser that asked for a console page without a valid
// credential to the login form, and reports whether it did.
func toLogin(w http.ResponseWriter, r *http.Request) bool {
	p := path.Clean("/" + r.URL.Path)
	if r.Method != http.MethodGet || (p != "/ui" && !strings.HasPrefix(p, "/ui/")) {
		return false
	}
	http.Redirect(w, r, "/ui/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
	return true
}
