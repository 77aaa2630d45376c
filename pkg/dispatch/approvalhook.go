package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/stdwebhook"
)

// The approval webhook: with Options.ApprovalWebhookURL, each call held
// for approval is also POSTed there, its record in JSON, signed as
// Standard Webhooks sign (and OpenAI's webhooks are): webhook-id (the
// call key and ".requested"), webhook-timestamp and webhook-signature.
// Like the NATS announcement it is a notice, not the source of truth
// (the approval API is): a replica sends it once, tries up to
// approvalHookAttempts times, and what is queued when the replica stops
// is not sent.

const (
	// approvalHookQueue bounds the notices waiting to be sent; more are
	// dropped, and logged.
	approvalHookQueue = 256
	// approvalHookAttempts bounds the tries of one notice, approvalHookTimeout
	// each.
	approvalHookAttempts = 4
	approvalHookTimeout  = 10 * time.Second
)

// approvalHook sends the approval webhook.
type approvalHook struct {
	url    string
	secret string
	client *http.Client
	queue  chan *Approval
}

// newApprovalHook checks the webhook's settings; nil when no URL is set.
func newApprovalHook(rawURL, secret string) (*approvalHook, error) {
	if rawURL == "" {
		if secret != "" {
			return nil, fmt.Errorf("dispatch: an approval webhook secret is set, but no URL")
		}
		return nil, nil
	}
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("dispatch: approval webhook URL %q: want an absolute http or https URL", rawURL)
	}
	if secret == "" {
		return nil, fmt.Errorf("dispatch: the approval webhook %s needs a secret to sign with", u.Redacted())
	}
	if _, err := stdwebhook.Key(secret); err != nil {
		return nil, fmt.Errorf("dispatch: approval webhook secret: %w", err)
	}
	return &approvalHook{url: rawURL, secret: secret, client: &http.Client{Timeout: approvalHookTimeout},
		queue: make(chan *Approval, approvalHookQueue)}, nil
}

// notify queues a's notice; it never blocks.
func (d *Dispatcher) notify(a *Approval) {
	if d.hook == nil {
		return
	}
	select {
	case d.hook.queue <- a:
	default:
		d.log.Warn("the approval webhook's queue is full; a request is not sent to it", "call_key", a.CallKey)
	}
}

// run sends the queued notices until ctx ends.
func (h *approvalHook) run(ctx context.Context, d *Dispatcher) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-h.queue:
			if err := h.send(ctx, a); err != nil && ctx.Err() == nil {
				d.log.Warn("the approval webhook was not delivered", "call_key", a.CallKey, "err", err)
			}
		}
	}
}

// send POSTs a's notice, trying again after a failure or a status other
// than 2xx.
func (h *approvalHook) send(ctx context.Context, a *Approval) error {
	body, _ := json.Marshal(a)
	id := string(a.CallKey) + ".requested"
	var err error
	for attempt := range approvalHookAttempts {
		if attempt > 0 && !backoff.Sleep(ctx, time.Duration(1<<attempt)*250*time.Millisecond) {
			return ctx.Err()
		}
		if err = h.post(ctx, id, body); err == nil {
			return nil
		}
	}
	return err
}

func (h *approvalHook) post(ctx context.Context, id string, body []byte) error {
	headers, err := stdwebhook.Sign(h.secret, id, time.Now(), body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header = headers
	resp, err := h.client.Do(req)
	if err != nil {
		return err
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("the endpoint answered %s", resp.Status)
	}
	return nil
}
