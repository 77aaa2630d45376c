package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The approval and audit API, under the token rules of the rest: a team
// token sees and decides its teams' held calls (and those whose policy
// names it), an admin all, an agent's tools-only token none.
//
//	GET  /v1/approvals?team=&all=1   held calls awaiting a decision,
//	                                 soonest auto-deny first (all=1: decided
//	                                 ones too), each with time_left_ms
//	GET  /v1/approvals/{call_key}    one held call
//	POST /v1/approvals/{call_key}/approve {"reason":"..."}  (reason optional)
//	POST /v1/approvals/{call_key}/deny    {"reason":"..."}
//	                                 200 with the decided record; 403 for a
//	                                 caller not among its approvers; 404 for
//	                                 none in the caller's scope; 409 when it
//	                                 was decided already (the error says how)
//	GET  /v1/audit?team=&since=&limit=
//	                                 the audit trail, oldest first, as JSON
//	                                 lines (application/x-ndjson); since is
//	                                 RFC 3339 or a duration back from now (24h)
func (a *Handler) routeApprovals(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/approvals", a.getApprovals)
	mux.HandleFunc("GET /v1/approvals/{key}", a.getApproval)
	mux.HandleFunc("POST /v1/approvals/{key}/approve", a.postDecision(true))
	mux.HandleFunc("POST /v1/approvals/{key}/deny", a.postDecision(false))
	mux.HandleFunc("GET /v1/audit", a.getAudit)
}

// ApprovalView is a held call as the API shows it.
type ApprovalView struct {
	*dispatch.Approval
	// TimeLeftMS is how long until the call is denied undecided; 0 once
	// that moment passed or it was decided.
	TimeLeftMS int64 `json:"time_left_ms"`
}

// ViewOf is ap as the API shows it at now.
func ViewOf(ap *dispatch.Approval, now time.Time) ApprovalView {
	v := ApprovalView{Approval: ap}
	if ap.State == dispatch.ApprovalAwaiting {
		v.TimeLeftMS = max(ap.AutoDenyAt.Sub(now).Milliseconds(), 0)
	}
	return v
}

func (a *Handler) getApprovals(w http.ResponseWriter, r *http.Request) {
	q := dispatch.ApprovalQuery{Team: r.URL.Query().Get("team")}
	switch all := r.URL.Query().Get("all"); all {
	case "", "0", "false":
	case "1", "true":
		q.All = true
	default:
		writeFieldError(w, &dispatch.FieldError{Field: "all", Message: "all must be 1 or 0"})
		return
	}
	list, err := a.d.Approvals(r.Context(), CallerOf(r), q)
	if err != nil {
		writeInspectError(w, err)
		return
	}
	now := time.Now()
	views := make([]ApprovalView, len(list))
	for i, ap := range list {
		views[i] = ViewOf(ap, now)
	}
	writeJSON(w, http.StatusOK, map[string]any{"approvals": views, "now": now.UTC()})
}

func (a *Handler) getApproval(w http.ResponseWriter, r *http.Request) {
	key, err := protocol.ParseCallKey(r.PathValue("key"))
	if err != nil {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no held call %q", r.PathValue("key")))
		return
	}
	ap, err := a.d.ApprovalOf(r.Context(), CallerOf(r), key)
	if err != nil {
		writeDecisionError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, ViewOf(ap, time.Now()))
}

func (a *Handler) postDecision(approve bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		// As for accepting a definition: a JSON body needs a CORS
		// preflight, which a page of another site riding on loopback
		// trust does not get.
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "send the body as Content-Type: application/json ({} or {\"reason\":\"...\"})")
			return
		}
		var body struct {
			Reason string `json:"reason"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 8192)).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
			writeFieldError(w, &dispatch.FieldError{Field: "reason", Message: `want {"reason":"..."}`})
			return
		}
		key, err := protocol.ParseCallKey(r.PathValue("key"))
		if err != nil {
			writeError(w, http.StatusNotFound, fmt.Sprintf("no held call %q", r.PathValue("key")))
			return
		}
		ap, err := a.d.Decide(r.Context(), CallerOf(r), key, dispatch.Decision{Approve: approve, Reason: strings.TrimSpace(body.Reason)})
		if err != nil {
			if errors.Is(err, dispatch.ErrDecided) && ap != nil {
				writeJSON(w, http.StatusConflict, map[string]any{"error": map[string]any{"message": strings.TrimPrefix(err.Error(), "dispatch: ")}, "approval": ViewOf(ap, time.Now())})
				return
			}
			writeDecisionError(w, err)
			return
		}
		writeJSON(w, http.StatusOK, ViewOf(ap, time.Now()))
	}
}

func writeDecisionError(w http.ResponseWriter, err error) {
	var fe *dispatch.FieldError
	switch {
	case errors.As(err, &fe):
		writeFieldError(w, fe)
	case errors.Is(err, dispatch.ErrNotFound):
		writeError(w, http.StatusNotFound, strings.TrimPrefix(err.Error(), "dispatch: "))
	case errors.Is(err, dispatch.ErrNotApprover):
		writeError(w, http.StatusForbidden, strings.TrimPrefix(err.Error(), "dispatch: "))
	case errors.Is(err, dispatch.ErrDecided):
		writeError(w, http.StatusConflict, strings.TrimPrefix(err.Error(), "dispatch: "))
	default:
		writeInspectError(w, err)
	}
}

func (a *Handler) getAudit(w http.ResponseWriter, r *http.Request) {
	q, fe := ParseAuditQuery(r.URL.Query())
	if fe != nil {
		writeFieldError(w, fe)
		return
	}
	entries, err := a.d.Audit(r.Context(), CallerOf(r), q)
	if err != nil {
		writeInspectError(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	enc := json.NewEncoder(w)
	for i := range entries {
		_ = enc.Encode(&entries[i])
	}
}

// ParseAuditQuery reads the audit trail's query parameters: team, since
// (an RFC 3339 time, or a duration back from now) and limit (1 to
// dispatch.MaxAuditEntries). The error names the field.
func ParseAuditQuery(v url.Values) (dispatch.AuditQuery, *dispatch.FieldError) {
	q := dispatch.AuditQuery{Team: v.Get("team")}
	if s := v.Get("since"); s != "" {
		if t, err := time.Parse(time.RFC3339, s); err == nil {
			q.Since = t
		} else if d, err := time.ParseDuration(s); err == nil && d > 0 {
			q.Since = time.Now().Add(-d)
		} else {
			return q, &dispatch.FieldError{Field: "since", Message: "since must be an RFC 3339 time or a duration back from now (24h)"}
		}
	}
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > dispatch.MaxAuditEntries {
			return q, &dispatch.FieldError{Field: "limit", Message: fmt.Sprintf("limit must be 1 to %d", dispatch.MaxAuditEntries)}
		}
		q.Limit = n
	}
	return q, nil
}
