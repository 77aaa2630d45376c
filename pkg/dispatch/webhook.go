package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// POST /webhooks/openai takes in the platform's signed webhooks:
//
//   - the signature (Standard Webhooks, verified by the SDK) and a
//     timestamp within 5 minutes are required, or 401 and nothing happens;
//   - a webhook-id already taken in gets 200 and nothing new happens, on
//     any replica;
//   - agent.session.action_required: the session is read and its required
//     action taken in as a turn;
//   - response.completed: the function calls of a response a watch drives
//     are taken in as a turn;
//   - 2xx only once the intake is durable; 503 (the platform retries) if it
//     cannot be.

// WebhookEvent is what a verified webhook says happened.
type WebhookEvent struct {
	// ID is the webhook's own id: a repeat of it is taken in once.
	ID string
	// Type is the event type; the dispatcher acts on
	// "agent.session.action_required" and "response.completed".
	Type string
	// ObjectID names the object the event is about (a session, a response).
	ObjectID string
}

// WebhookVerifier authenticates a platform's webhook and decodes its event.
// An error means the webhook is not authentic, or too old or too far in
// the future to trust, and it is answered 401.
type WebhookVerifier interface {
	Verify(body []byte, header http.Header) (*WebhookEvent, error)
}

func (d *Dispatcher) postWebhook(w http.ResponseWriter, r *http.Request) {
	ctx := d.tel.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	count := func(typ, outcome string) {
		d.tel.webhooks.Add(ctx, 1, metric.WithAttributes(attrEventType.String(typ), attrOutcome.String(outcome)))
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		writeError(w, http.StatusBadRequest, "could not read the body")
		return
	}
	if d.opts.Webhooks == nil {
		count("", "rejected")
		d.log.WarnContext(ctx, "webhook refused: no webhook verifier (OPENAI_WEBHOOK_SECRET) is set")
		writeError(w, http.StatusUnauthorized, "webhooks are not configured on this dispatcher")
		return
	}
	ev, err := d.opts.Webhooks.Verify(body, r.Header)
	if err != nil {
		count("", "rejected")
		d.log.WarnContext(ctx, "webhook refused", "webhook_id", r.Header.Get("webhook-id"), "size", len(body), "err", err)
		writeError(w, http.StatusUnauthorized, "signature verification failed")
		return
	}
	seenKey := webhookKey(ev.ID)
	if _, err := d.webhooksSeen.Get(ctx, seenKey); err == nil {
		count(ev.Type, "duplicate")
		writeJSON(w, http.StatusOK, map[string]string{"status": "duplicate"})
		return
	}
	outcome, err := d.takeInEvent(ctx, ev.Type, ev.ObjectID)
	if err != nil {
		count(ev.Type, "error")
		d.log.ErrorContext(ctx, "webhook intake failed; the platform will retry", "type", ev.Type, "id", ev.ObjectID, "err", err)
		writeError(w, http.StatusServiceUnavailable, "intake failed; retry")
		return
	}
	// Only now is the event remembered: a crash before this point makes the
	// platform's retry take it in (intake is idempotent).
	if _, err := d.webhooksSeen.Create(ctx, seenKey, []byte(ev.Type)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		d.log.WarnContext(ctx, "remembering the webhook-id failed", "err", err)
	}
	count(ev.Type, outcome)
	writeJSON(w, http.StatusOK, map[string]string{"status": outcome})
}

// webhookKey is a valid KV key for any webhook-id.
func webhookKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16])
}

// takeInEvent acts on one event; it returns "accepted" or "ignored".
func (d *Dispatcher) takeInEvent(ctx context.Context, typ, id string) (string, error) {
	var ref Ref
	switch typ {
	case "agent.session.action_required":
		ref = Ref{Platform: protocol.PlatformAgents, SessionID: id}
	case "response.completed":
		e, err := d.responses.Get(ctx, webhookSafe(id))
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return "ignored", nil // not a response the dispatcher drives
		}
		if err != nil {
			return "", err
		}
		w, err := d.WatchStatus(ctx, string(e.Value()))
		if err != nil {
			return "", err
		}
		ref = w.Current
		ref.ResponseID = id
	default:
		return "ignored", nil
	}
	p := d.platforms[ref.Platform]
	if p == nil {
		return "ignored", nil
	}
	obs, err := p.Poll(ctx, ref)
	if err != nil {
		return "", err
	}
	if obs.State != ObjectRequiresAction {
		return "ignored", nil // already answered, or not waiting any more
	}
	obs.Turn.Channel = "webhook"
	if _, err := d.Intake(ctx, obs.Turn); err != nil {
		return "", err
	}
	return "accepted", nil
}

// indexResponse records that a watch drives a response.
func (d *Dispatcher) indexResponse(ctx context.Context, responseID, watchID string) {
	if responseID == "" {
		return
	}
	if _, err := d.responses.Put(ctx, webhookSafe(responseID), []byte(watchID)); err != nil {
		d.log.WarnContext(ctx, "indexing a driven response failed", "response", responseID, "err", err)
	}
}

// webhookSafe keeps IDs usable as KV keys: platform IDs are alphanumeric
// with _ and -, which KV accepts; anything else is hashed.
func webhookSafe(id string) string {
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return webhookKey(id)
		}
	}
	return id
}
