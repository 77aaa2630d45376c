// Package console is the operator console the dispatcher serves at /ui:
// server-rendered pages (html/template) of open turns racing their
// deadlines, recently closed turns, functions, dead letters and watches,
// with a little JavaScript, embedded, for what must change in place (the
// turns page follows GET /v1/turns/stream) and for replaying dead letters.
// Nothing is loaded from anywhere else and there is no build step.
//
// It reads what the dispatcher's inspection API reads (pkg/dispatch's
// Inspect* methods), plus the dead letters through pkg/exec's
// [exec.DeadLetters], which it also serves as JSON: GET /v1/deadletters
// and POST /v1/deadletters/replay. Dead letters live in each team's
// account; it reads them team by team through the dispatcher's way into
// that account ([dispatch.Dispatcher.TeamJetStream]: the same account in a
// single-account deployment, read-only paths under dispatcher
// nats-config), the newest [DeadLetterRecords] records of each. Everything is behind the HTTP API's
// guard ([httpapi.Handler.Guard]): the API's tokens, or loopback
// clients only without them. A browser gives its token once, to the login
// form, which keeps it in an HttpOnly, SameSite=Strict cookie.
package console

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Options configures a Console. The zero value is valid.
type Options struct {
	// Logger receives the console's logs. Default: slog.Default().
	Logger *slog.Logger
	// TraceURL, if set, links each turn's trace id to a tracing UI: its
	// "{trace_id}" is replaced by the id (for Jaeger,
	// "https://jaeger.example/trace/{trace_id}"). Default: the id is shown
	// unlinked.
	TraceURL string
	// SessionMaxAge is how long the login cookie lasts. Default: 12h.
	SessionMaxAge time.Duration
}

// DefaultSessionMaxAge is how long a console login lasts by default.
const DefaultSessionMaxAge = 12 * time.Hour

// Console serves the operator console of one dispatcher.
type Console struct {
	d     *dispatch.Dispatcher
	api   *httpapi.Handler
	opts  Options
	log   *slog.Logger
	pages map[string]*template.Template
}

// New returns the console of d, served beside api (d's HTTP API), whose
// guard and tokens it shares.
func New(d *dispatch.Dispatcher, api *httpapi.Handler, opts Options) (*Console, error) {
	if d == nil || api == nil {
		return nil, errors.New("console: a dispatcher and its HTTP API are required")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.SessionMaxAge <= 0 {
		opts.SessionMaxAge = DefaultSessionMaxAge
	}
	c := &Console{d: d, api: api, opts: opts, log: opts.Logger.With("component", "console"), pages: map[string]*template.Template{}}
	funcs := template.FuncMap{"traceURL": c.traceURL, "pct": pct, "clock": clock, "join": strings.Join, "ago": ago, "ms": ms,
		"unixms": func(t time.Time) int64 { return t.UnixMilli() }, "short": short, "shortid": shortID, "list": func(s ...string) []string { return s },
		"deref": func(s *string) string { return *s }, "percent": func(f float64) float64 { return 100 * f }, "jsontext": jsonText}
	for _, page := range []string{"turns", "turn", "functions", "deadletters", "watches", "approvals", "audit", "login"} {
		// The held calls' table is on the approvals page and atop the turns.
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/approvalrows.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", page, err)
		}
		c.pages[page] = t
	}
	return c, nil
}

// Mount registers the console's routes on mux, behind the dispatcher's
// guard: /ui/... and the dead-letter API under /v1/deadletters.
func (c *Console) Mount(mux *http.ServeMux) {
	m := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static")
	m.Handle("GET /ui/static/", http.StripPrefix("/ui/static/", cacheStatic(http.FileServerFS(static))))
	m.HandleFunc("GET /ui/login", c.loginForm)
	m.HandleFunc("POST /ui/login", c.login)
	m.HandleFunc("POST /ui/logout", c.logout)
	m.HandleFunc("GET /ui/{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/ui/turns", http.StatusSeeOther) })
	m.HandleFunc("GET /ui/turns", c.turnsPage)
	m.HandleFunc("GET /ui/turns/{key}", c.turnPage)
	m.HandleFunc("GET /ui/functions", c.functionsPage)
	m.HandleFunc("GET /ui/deadletters", c.deadLettersPage)
	m.HandleFunc("GET /ui/watches", c.watchesPage)
	m.HandleFunc("GET /ui/approvals", c.approvalsPage)
	m.HandleFunc("GET /ui/audit", c.auditPage)
	m.HandleFunc("GET /v1/deadletters", c.getDeadLetters)
	m.HandleFunc("POST /v1/deadletters/replay", c.postReplay)
	m.Handle("GET /ui", http.RedirectHandler("/ui/turns", http.StatusSeeOther))
	h := securityHeaders(c.api.Guard(m))
	mux.Handle("/ui", h)
	mux.Handle("/ui/", h)
	mux.Handle("/v1/deadletters", h)
	mux.Handle("/v1/deadletters/", h)
}

// securityHeaders forbids what the console never needs: scripts, styles
// or frames from anywhere but itself.
func securityHeaders(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "same-origin")
		h.ServeHTTP(w, r)
	})
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}

// page is what every page's template gets.
type page struct {
	Title  string
	Nav    string
	Caller dispatch.Caller
	// Login says the caller logged in with a token (and may log out).
	Login bool
	Error string
	// Show says the page has content (Data) to render.
	Show bool
	Data any
}

func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	p.Caller = httpapi.CallerOf(r)
	p.Show = p.Data != nil
	_, err := r.Cookie(httpapi.SessionCookie)
	p.Login = err == nil && c.api.TokensRequired()
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if err := c.pages[name].Execute(w, p); err != nil {
		c.log.Error("rendering a console page failed", "page", name, "err", err)
	}
}

// traceURL is the link of a trace id, or "" when no TraceURL is set.
func (c *Console) traceURL(id string) string {
	if c.opts.TraceURL == "" || id == "" {
		return ""
	}
	return strings.ReplaceAll(c.opts.TraceURL, "{trace_id}", url.PathEscape(id))
}

// pct is the share of a turn's budget still left, 0 to 100.
func pct(left, budget int64) int64 {
	if budget <= 0 || left <= 0 {
		return 0
	}
	return min(100, left*100/budget)
}

func clock(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("15:04:05")
}

func ago(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return time.Since(t).Round(time.Second).String() + " ago"
}

func ms(n int64) string {
	if n < 0 {
		return "overdue"
	}
	return (time.Duration(n) * time.Millisecond).Round(time.Second).String()
}

// short is the first 12 characters of a turn key: enough to tell turns
// apart on a page.
func short(key protocol.TurnKey) string { return string(key[:min(len(key), 12)]) }

// shortID shortens a long platform id for a table: its start and end.
func shortID(id string) string {
	if len(id) <= 18 {
		return id
	}
	return id[:10] + "…" + id[len(id)-5:]
}

// jsonText is a JSON document indented for reading.
func jsonText(raw json.RawMessage) string {
	var b bytes.Buffer
	if json.Indent(&b, raw, "", "  ") != nil {
		return string(raw)
	}
	return b.String()
}

// inspectError shows an error of the inspection methods on a page.
func (c *Console) inspectError(w http.ResponseWriter, r *http.Request, name string, err error) {
	status := http.StatusServiceUnavailable
	var fe *dispatch.FieldError
	if errors.As(err, &fe) {
		status = http.StatusBadRequest
		if errors.Is(fe, dispatch.ErrOutOfScope) {
			status = http.StatusForbidden
		}
	}
	c.render(w, r, status, name, page{Title: "Error", Nav: name, Error: strings.TrimPrefix(err.Error(), "dispatch: ")})
}

// requestContext bounds the work of one page.
func requestContext(r *http.Request) (context.Context, context.CancelFunc) {
	return context.WithTimeout(r.Context(), 30*time.Second)
}
