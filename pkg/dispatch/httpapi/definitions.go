package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// postAccept answers POST /v1/functions/{name}/accept
// {"definition_digest":"..."}: an admin accepts a definition that live
// executors of the function declare (its pending_definitions in GET
// /v1/functions), which agents then read. 403 for a caller that is not an
// admin; 404 when no live executor declares that definition.
func (a *Handler) postAccept(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	if !caller.Admin {
		writeError(w, http.StatusForbidden, "only an admin token may accept a function's definition")
		return
	}
	// A page of another site can make a browser send a form (riding on
	// loopback trust), not a JSON request: that needs a CORS preflight.
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send the body as Content-Type: application/json")
		return
	}
	var body struct {
		Digest string `json:"definition_digest"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 4096)).Decode(&body); err != nil || body.Digest == "" {
		writeFieldError(w, &dispatch.FieldError{Field: "definition_digest", Message: `want {"definition_digest":"<a pending definition's digest>"}`})
		return
	}
	name := r.PathValue("name")
	err := a.d.AcceptDefinition(r.Context(), name, body.Digest, "admin "+caller.Name)
	switch {
	case errors.Is(err, dispatch.ErrNotFound):
		writeError(w, http.StatusNotFound, fmt.Sprintf("no live executor of %s declares definition %s (GET /v1/functions lists its pending_definitions)", name, body.Digest))
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, strings.TrimPrefix(err.Error(), "dispatch: "))
	default:
		writeJSON(w, http.StatusOK, map[string]string{"function": name, "definition_digest": body.Digest, "accepted_by": caller.Name})
	}
}
