package httpapi

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"
)

// A dispatcher without tokens trusts its loopback clients, and a browser on
// its host is one: any page it shows can make it send requests. These
// checks refuse what only a page of another site would send.
//
//   - DNS rebinding: a page of rebind.attacker.example whose name then
//     resolves to 127.0.0.1 is same-origin with the dispatcher in the
//     browser's eyes, and reads every answer. Its requests carry its own
//     name as Host: a loopback client must use a loopback name (421).
//   - Cross-site requests: a page's fetch or form carries its Origin (and
//     Sec-Fetch-Site); another origin's is refused (403), except a
//     navigation, a link to the console, which reads nothing for the page.
//   - Forms: a request that changes something and is authenticated by what
//     a browser sends on its own (the loopback address, the console's
//     cookie) must be one no form can send (Content-Type: application/json,
//     or X-Toolrelay-Console), else 415: a page that wants to send one
//     needs a CORS preflight, which this API never grants.
//
// Webhooks carry their own signature and are not checked; with tokens,
// neither Host nor Origin is (a proxy may send a public name).

// consoleHeader is the header the console's scripts send with what they
// change: a page of another site cannot make a browser send it.
const consoleHeader = "X-Toolrelay-Console"

// checkBrowser answers 421 or 403 to a request a web page made a browser
// on the dispatcher's host send, without tokens, and reports whether r may
// go on.
func (a *Handler) checkBrowser(w http.ResponseWriter, r *http.Request) bool {
	if a.opts.Authenticator != nil || !isLoopback(r.RemoteAddr) || path.Clean("/"+r.URL.Path) == "/webhooks/openai" {
		return true
	}
	if !loopbackHost(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, fmt.Sprintf(
			"this dispatcher serves loopback clients only, under a loopback name: use http://localhost or http://127.0.0.1, not Host %q "+
				"(a web page using DNS rebinding sends its own name); to serve other names, give it API tokens (TOOLRELAY_API_TOKENS_FILE)", r.Host))
		return false
	}
	if why := crossOrigin(r); why != "" {
		writeError(w, http.StatusForbidden, fmt.Sprintf(
			"cross-origin request refused (%s): without API tokens this dispatcher trusts its loopback clients, so it answers only its own pages and non-browser clients", why))
		return false
	}
	return true
}

// loopbackHost reports whether host (a Host header, with or without a
// port) names the loopback interface: localhost, 127.0.0.0/8 or ::1.
func loopbackHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// crossOrigin says why r comes from a page of another origin, or "" if it
// does not (a request without Origin or Sec-Fetch-Site is not a browser's,
// or a navigation).
func crossOrigin(r *http.Request) string {
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "", "same-origin", "none":
	default:
		if !safeMethod(r.Method) || r.Header.Get("Sec-Fetch-Mode") != "navigate" {
			return "Sec-Fetch-Site: " + site
		}
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host == "" || !strings.EqualFold(u.Host, r.Host) {
			return "Origin: " + o
		}
	}
	return ""
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// formSafe reports whether r, authenticated by what a browser sends on
// its own, is one a form cannot send: a read, or JSON, or with the
// console's header, or not a browser's at all (no Origin, no Sec-Fetch-*:
// every browser adds them to a form's POST; curl -d adds neither). Only the
// API's routes are held to it; the console's own login and logout forms
// are not.
func formSafe(r *http.Request) bool {
	if safeMethod(r.Method) || r.Header.Get(consoleHeader) != "" {
		return true
	}
	if r.Header.Get("Origin") == "" && r.Header.Get("Sec-Fetch-Site") == "" && r.Header.Get("Sec-Fetch-Mode") == "" {
		return true
	}
	p := path.Clean("/" + r.URL.Path)
	if p != "/mcp" && p != "/v1" && !strings.HasPrefix(p, "/v1/") {
		return true
	}
	mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	return mt == "application/json"
}
