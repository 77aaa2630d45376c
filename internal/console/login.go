package console

import (
	"net/http"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// loginData is the login page.
type loginData struct {
	Next string
	// NoTokens says the dispatcher takes no tokens: loopback clients need
	// no login.
	NoTokens bool
}

// safeNext is where to go after logging in: a console path, never another
// site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/ui/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n") {
		return "/ui/turns"
	}
	return next
}

func (c *Console) loginForm(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", page{Title: "Log in", Nav: "login",
		Data: loginData{Next: safeNext(r.URL.Query().Get("next")), NoTokens: !c.api.TokensRequired()}})
}

// login takes a token from the form and, if the dispatcher knows it, keeps
// it in the session cookie.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 8<<10)
	next := safeNext(r.PostFormValue("next"))
	if !c.api.TokensRequired() {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	token := strings.TrimSpace(r.PostFormValue("token"))
	caller, ok := c.api.CheckToken(token)
	if !ok {
		c.log.WarnContext(r.Context(), "console login with an unknown token refused", "remote", r.RemoteAddr)
		c.render(w, r, http.StatusUnauthorized, "login", page{Title: "Log in", Nav: "login", Error: "That token is not known to this dispatcher.",
			Data: loginData{Next: next}})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: httpapi.SessionCookie, Value: token, Path: "/", MaxAge: int(c.opts.SessionMaxAge.Seconds()),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: overTLS(r)})
	c.log.InfoContext(r.Context(), "console login", "caller", caller)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: httpapi.SessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: overTLS(r)})
	http.Redirect(w, r, "/ui/login", http.StatusSeeOther)
}

// overTLS reports whether the browser reached the console over TLS: here,
// or at a proxy in front that says so. A cookie marked Secure is then never
// sent over plain HTTP.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}
