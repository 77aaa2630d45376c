package httpapi

import (
	"errors"
	"io"
	"net/http"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// maxWebhookBody bounds the body of a webhook read.
const maxWebhookBody = 1 << 20

// postWebhook answers POST /webhooks/openai (see
// [dispatch.Dispatcher.TakeInWebhook]): 401 for a webhook that cannot be
// trusted, 200 with {"status":"accepted"|"ignored"|"duplicate"} once its
// intake is durable, 503 (the platform retries) when it is not.
func (a *Handler) postWebhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxWebhookBody))
	if err != nil {
		writeError(w, http.StatusBadRequest, "could not read the body")
		return
	}
	outcome, err := a.d.TakeInWebhook(r.Context(), body, r.Header)
	switch {
	case errors.Is(err, dispatch.ErrNoWebhookVerifier):
		writeError(w, http.StatusUnauthorized, "webhooks are not configured on this dispatcher")
	case errors.Is(err, dispatch.ErrWebhookNotAuthentic):
		writeError(w, http.StatusUnauthorized, "signature verification failed")
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, "intake failed; retry")
	default:
		writeJSON(w, http.StatusOK, map[string]string{"status": outcome})
	}
}
