package httpapi

import (
	"fmt"
	"net/http"
	"net/url"
	"path"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
)

// MCP authorization, as the MCP specification has it (after RFC 9728):
// with tokens, /mcp is an OAuth protected resource. A request without a
// valid token gets 401 with a WWW-Authenticate challenge naming the
// resource's metadata, and the metadata says which authorization servers
// issue its tokens. The dispatcher issues none and checks only its own
// tokens: an OAuth deployment puts a proxy in front that checks the
// authorization server's token (its audience is the resource below) and
// sends a toolrelay token on (docs/security.md).

// wellKnownResource is where RFC 9728 puts a protected resource's metadata:
// at the root for the whole origin, and under it for a resource with a
// path (/mcp's is wellKnownResource + "/mcp").
const wellKnownResource = "/.well-known/oauth-protected-resource"

// CheckPublicURL checks a value for [Options.PublicURL] or
// [Options.AuthorizationServers]: an absolute http or https URL with no
// query, fragment or user.
func CheckPublicURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return fmt.Errorf("%q is not an absolute http or https URL (such as https://tools.example.com) with no query, fragment or user", s)
	}
	return nil
}

// publicBase is the API's address as this client reached it, with no
// trailing slash: Options.PublicURL, else the request's scheme and Host.
// The metadata is public and names nothing secret, so a Host a client
// made up misleads only that client.
func (a *Handler) publicBase(r *http.Request) string {
	if a.opts.PublicURL != "" {
		return strings.TrimRight(a.opts.PublicURL, "/")
	}
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

// resourceChallenge is the parameter a 401 of /mcp adds to its
// WWW-Authenticate challenge: where the resource's metadata is. Other
// paths, and a dispatcher without tokens, add none.
func (a *Handler) resourceChallenge(r *http.Request) string {
	if a.opts.Authenticator == nil || path.Clean("/"+r.URL.Path) != "/mcp" {
		return ""
	}
	return fmt.Sprintf(`, resource_metadata=%q`, a.publicBase(r)+wellKnownResource+"/mcp")
}

// protectedResource serves the RFC 9728 metadata of /mcp (under its path)
// and of the API as a whole (at the root), open to all and to every origin
// (the SDK's handler: browser-based MCP clients read it cross-origin).
// Without tokens there is nothing to authorize: 404.
func (a *Handler) protectedResource(w http.ResponseWriter, r *http.Request) {
	if a.opts.Authenticator == nil {
		writeError(w, http.StatusNotFound, "this dispatcher has no API tokens (TOOLRELAY_API_TOKENS_FILE): /mcp serves loopback clients only, "+
			"and there is no authorization to discover")
		return
	}
	resource := a.publicBase(r)
	if strings.TrimPrefix(path.Clean(r.URL.Path), wellKnownResource) == "/mcp" {
		resource += "/mcp"
	}
	auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
		Resource:               resource,
		AuthorizationServers:   a.opts.AuthorizationServers,
		BearerMethodsSupported: []string{"header"},
		ResourceName:           "toolrelay fleet",
	}).ServeHTTP(w, r)
}
