package platformsim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"time"

	"github.com/toolrelay/toolrelay/internal/stdwebhook"
)

// Webhook configures the simulator to deliver signed webhooks (Standard
// Webhooks, as OpenAI signs them) to an endpoint.
type Webhook struct {
	// URL receives the events.
	URL string
	// Secret signs them: "whsec_" + base64 of the key, or raw key bytes.
	Secret string
}

// WebhookEvent is one event the simulator delivered or tried to.
type WebhookEvent struct {
	ID     string
	Type   string
	Status int // HTTP status the endpoint answered; 0 if unreachable
}

// Sign returns the Standard Webhooks headers for body: webhook-id,
// webhook-timestamp and webhook-signature ("v1,<base64 HMAC-SHA256>").
func Sign(secret, id string, at time.Time, body []byte) (http.Header, error) {
	return stdwebhook.Sign(secret, id, at, body)
}

// WebhookBody builds an event envelope as the platform sends it.
func WebhookBody(eventID, typ string, data any) []byte {
	b, _ := json.Marshal(map[string]any{"id": eventID, "object": "event", "created_at": time.Now().Unix(), "type": typ, "data": data})
	return b
}

// Webhooks returns the events delivered so far, in order.
func (s *Server) Webhooks() []WebhookEvent {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]WebhookEvent(nil), s.delivered...)
}

// Webhook delivery retries: 200ms doubling to 10s, 8 attempts in all.
const (
	webhookAttempts   = 8
	webhookFirstRetry = 200 * time.Millisecond
	webhookMaxRetry   = 10 * time.Second
)

// notify delivers an event in the background, retrying with backoff as the
// platform does on failure. Caller holds s.mu.
func (s *Server) notify(typ string, data any) {
	hook := s.opts.Webhook
	if hook == nil || hook.URL == "" {
		return
	}
	eventID := newID("evt_")
	webhookID := newID("wh_")
	body := WebhookBody(eventID, typ, data)
	s.bg.Go(func() {
		// The platform retries a failed delivery with exponential backoff
		// (for up to three days); here for about half a minute.
		status := 0
		wait := webhookFirstRetry
		for attempt := range webhookAttempts {
			if attempt > 0 {
				select {
				case <-time.After(wait):
				case <-s.closed:
					return
				}
				wait = min(2*wait, webhookMaxRetry)
			}
			h, err := Sign(hook.Secret, webhookID, time.Now(), body)
			if err != nil {
				s.log.Error("webhook secret", "err", err)
				return
			}
			req, _ := http.NewRequest(http.MethodPost, hook.URL, bytes.NewReader(body))
			req.Header = h
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				continue
			}
			resp.Body.Close()
			status = resp.StatusCode
			if status < 300 || status < 500 && status != http.StatusRequestTimeout && status != http.StatusTooManyRequests {
				break // delivered, or refused for good (a bad signature, say)
			}
		}
		s.mu.Lock()
		s.delivered = append(s.delivered, WebhookEvent{ID: webhookID, Type: typ, Status: status})
		s.mu.Unlock()
	})
}
