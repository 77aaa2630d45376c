package console

import (
	"errors"
	"net/http"
	"net/url"
	"slices"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// pageAuditEntries is the most audit entries the page shows: the newest.
const pageAuditEntries = 500

// auditData is the audit page.
type auditData struct {
	Team, Since string
	// Entries are the newest first.
	Entries []dispatch.AuditEntry
	// More says older entries matched beyond Limit; Truncated that one
	// read of the trail could not hold every match, so the newest may be
	// missing.
	More, Truncated bool
	Limit           int
	// Export is the same query on GET /v1/audit.
	Export string
}

// auditPage lists the audit trail as GET /v1/audit reads it for the
// caller (team=, since=; the last day by default), newest first.
func (c *Console) auditPage(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	since := v.Get("since")
	if since == "" {
		since = "24h"
	}
	q, fe := httpapi.ParseAuditQuery(url.Values{"team": {v.Get("team")}, "since": {since}})
	if fe != nil {
		c.inspectError(w, r, "audit", fe)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	entries, err := c.d.Audit(ctx, httpapi.CallerOf(r), q)
	switch {
	case errors.Is(err, dispatch.ErrOutOfScope):
		c.render(w, r, http.StatusForbidden, "audit", page{Title: "Audit", Nav: "audit", Error: "The audit trail of team " + q.Team + " is not yours to read."})
		return
	case err != nil:
		c.inspectError(w, r, "audit", err)
		return
	}
	// Audit reads oldest first, up to its bound: the page keeps the
	// newest of them.
	truncated := len(entries) >= dispatch.MaxAuditEntries
	more := len(entries) > pageAuditEntries
	if more {
		entries = entries[len(entries)-pageAuditEntries:]
	}
	slices.Reverse(entries)
	export := url.Values{"since": {since}}
	if q.Team != "" {
		export.Set("team", q.Team)
	}
	c.render(w, r, http.StatusOK, "audit", page{Title: "Audit", Nav: "audit", Data: auditData{Team: q.Team, Since: since, Entries: entries,
		More: more, Truncated: truncated, Limit: pageAuditEntries, Export: "/v1/audit?" + export.Encode()}})
}
