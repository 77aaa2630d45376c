package httpapi

import (
	"cmp"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/tooldef"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// getTools answers GET /v1/tools?platform=responses&team=a,b: the tool
// definitions of the functions live executors serve, of the caller's teams
// (and of those named by team, which must be the caller's), each with its
// team, as {"platform":..., "tools":[tooldef.Tool...]}.
func (a *Handler) getTools(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	q := r.URL.Query()
	p := protocol.Platform(cmp.Or(q.Get("platform"), string(protocol.PlatformResponses)))
	if p.Validate() != nil || p == protocol.PlatformMCP {
		writeFieldError(w, &dispatch.FieldError{Field: "platform", Message: "platform must be agents, assistants or responses"})
		return
	}
	sees := caller.Sees
	if list := q.Get("team"); list != "" {
		teams := strings.Split(list, ",")
		for _, t := range teams {
			if !caller.Sees(t) {
				writeQueryError(w, &dispatch.FieldError{Field: "team", Err: dispatch.ErrOutOfScope,
					Message: fmt.Sprintf("team %s is not one of your teams (%s)", t, strings.Join(caller.Teams, ", "))})
				return
			}
		}
		sees = func(team string) bool { return slices.Contains(teams, team) }
	}
	if !a.d.Ready() {
		writeError(w, http.StatusServiceUnavailable, "the dispatcher is starting or stopping; retry shortly")
		return
	}
	specs := a.d.ServedFunctions(sees)
	tools, err := tooldef.Export(specs, p)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	body := map[string]any{"platform": p, "tools": tools}
	if left := tooldef.Left(specs, p); len(left) > 0 {
		body["not_offered"] = left
	}
	writeJSON(w, http.StatusOK, body)
}
