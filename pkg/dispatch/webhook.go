package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A platform's signed webhooks (POST /webhooks/openai, package httpapi):
//
//   - the signature (Standard Webhooks, verified by the SDK) and a
//     timestamp within 5 minutes are required, or 401 and nothing happens;
//   - a webhook-id already taken in gets 200 and nothing new happens, on
//     any replica;
//   - agent.session.action_required: the session is read and its required
//     action taken in as a turn;
//   - response.completed: the function calls of a response a watch drives
//     (WatchDriver.Response) are taken in as a turn;
//   - accepted only once the intake is durable; an error (503: the
//     platform retries) if it cannot be.

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

// Why [Dispatcher.TakeInWebhook] refused a webhook: nothing was done.
var (
	// ErrNoWebhookVerifier: no [Options.Webhooks] is set, so no webhook
	// can be authenticated.
	ErrNoWebhookVerifier = errors.New("dispatch: webhooks are not configured on this dispatcher")
	// ErrWebhookNotAuthentic: the verifier refused the webhook (a bad
	// signature, or a timestamp too far off).
	ErrWebhookNotAuthentic = errors.New("dispatch: webhook signature verification failed")
)

// TakeInWebhook authenticates a platform's webhook (its body and headers)
// with [Options.Webhooks] and acts on its event, once per webhook-id on any
// replica. It returns "accepted" (a turn was taken in, durably), "ignored"
// (nothing to do) or "duplicate" (already taken in). It returns
// ErrNoWebhookVerifier or an error wrapping ErrWebhookNotAuthentic when the
// webhook cannot be trusted, and other errors when the intake failed (the
// platform should retry). A traceparent in header makes the turn its
// child. Every outcome is counted (toolrelay.webhooks).
func (d *Dispatcher) TakeInWebhook(ctx context.Context, body []byte, header http.Header) (outcome string, err error) {
	ctx = d.tel.prop.Extract(ctx, propagation.HeaderCarrier(header))
	count := func(typ, outcome string) {
		d.tel.webhooks.Add(ctx, 1, metric.WithAttributes(attrEventType.String(typ), attrOutcome.String(outcome)))
	}
	if d.opts.Webhooks == nil {
		count("", "rejected")
		d.log.WarnContext(ctx, "webhook refused: no webhook verifier (OPENAI_WEBHOOK_SECRET) is set")
		return "", ErrNoWebhookVerifier
	}
	ev, err := d.opts.Webhooks.Verify(body, header)
	if err != nil {
		count("", "rejected")
		d.log.WarnContext(ctx, "webhook refused", "webhook_id", header.Get("webhook-id"), "size", len(body), "err", err)
		return "", fmt.Errorf("%w: %w", ErrWebhookNotAuthentic, err)
	}
	seenKey := webhookKey(ev.ID)
	if _, err := d.webhooksSeen.Get(ctx, seenKey); err == nil {
		count(ev.Type, "duplicate")
		return "duplicate", nil
	}
	outcome, err = d.takeInEvent(ctx, ev.Type, ev.ObjectID)
	if err != nil {
		count(ev.Type, "error")
		d.log.ErrorContext(ctx, "webhook intake failed; the platform will retry", "type", ev.Type, "id", ev.ObjectID, "err", err)
		return "", err
	}
	// Only now is the event remembered: a crash before this point makes the
	// platform's retry take it in (intake is idempotent).
	if _, err := d.webhooksSeen.Create(ctx, seenKey, []byte(ev.Type)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		d.log.WarnContext(ctx, "remembering the webhook-id failed", "err", err)
	}
	count(ev.Type, outcome)
	return outcome, nil
}

// webhookKey is a valid KV key for any webhook-id.
func webhookKey(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16])
}

// takeInEvent acts on one event; it returns "accepted", "ignored" or
// "unsupported" (the object waits only on what toolrelay does not serve).
func (d *Dispatcher) takeInEvent(ctx context.Context, typ, id string) (string, error) {
	var ref Ref
	switch typ {
	case "agent.session.action_required":
		ref = Ref{Platform: protocol.PlatformAgents, SessionID: id}
	case "response.completed":
		w := d.driver()
		if w == nil {
			return "ignored", nil // no watch drives a response here
		}
		r, ok, err := w.Response(ctx, id)
		if err != nil {
			return "", err
		}
		if !ok {
			return "ignored", nil // not a response the dispatcher drives
		}
		ref = r
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
	// A webhook has no watch to show it on: the log and the counter say it
	// (the webhooks counter reads "unsupported").
	d.ReportUnsupported(ctx, ref, obs.Unsupported...)
	if obs.State == ObjectUnsupported {
		return "unsupported", nil
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
