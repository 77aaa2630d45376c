package openaiplatform

import (
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/webhooks"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// New returns the adapters of the three platforms over one client. Point
// the client at OpenAI, at an Azure OpenAI endpoint or at a Microsoft
// Foundry project endpoint ({project}/openai/v1).
func New(client openai.Client) []dispatch.Platform {
	return []dispatch.Platform{NewAgents(client), NewAssistants(client), NewResponses(client)}
}

// submitOpts leave retries to the dispatcher, which honours Retry-After and
// bounds them by the run's expiry.
var submitOpts = []option.RequestOption{option.WithMaxRetries(0)}

// classify turns an SDK error into a dispatch.PlatformError.
func classify(op string, err error) error {
	if err == nil {
		return nil
	}
	pe := &dispatch.PlatformError{Op: op, Err: err}
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		pe.Retryable = true // transport error: no answer came
		return pe
	}
	pe.StatusCode = apiErr.StatusCode
	pe.Retryable = apiErr.StatusCode == http.StatusTooManyRequests || apiErr.StatusCode == http.StatusRequestTimeout ||
		apiErr.StatusCode == http.StatusConflict || apiErr.StatusCode >= 500
	if apiErr.Response != nil {
		pe.RetryAfter = retryAfter(apiErr.Response.Header, time.Now())
	}
	if apiErr.Message != "" {
		pe.Err = errors.New(strconv.Itoa(apiErr.StatusCode) + " " + apiErr.Message)
	}
	return pe
}

// retryAfter reads Retry-After-Ms or Retry-After (seconds or an HTTP date).
func retryAfter(h http.Header, now time.Time) time.Duration {
	if v := h.Get("Retry-After-Ms"); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms > 0 {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	if v := h.Get("Retry-After"); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s > 0 {
			return time.Duration(s * float64(time.Second))
		}
		if t, err := http.ParseTime(v); err == nil && t.After(now) {
			return t.Sub(now)
		}
	}
	return 0
}

// apiMessage returns the platform's error message, or "".
func apiMessage(err error) (status int, message string) {
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		return apiErr.StatusCode, apiErr.Message
	}
	return 0, ""
}

// dispatch.Output size limits the platforms accept for one tool output.
const (
	maxAgentsOutput     = 256 << 10
	maxAssistantsOutput = 512 << 10
	maxResponsesOutput  = 256 << 10
)

// modelOutput renders a result for platforms without a failure flag, cut to
// the platform's limit with a marker.
func modelOutput(r *protocol.Result, limit int) string {
	return protocol.Truncate(r.ModelOutput(), limit)
}

// webhookTolerance is how far a webhook's timestamp may be from now.
const webhookTolerance = 5 * time.Minute

// Webhooks verifies OpenAI's signed webhooks (Standard Webhooks) with
// secret ("whsec_..." or the raw secret), refusing a timestamp more than 5
// minutes from now.
func Webhooks(secret string) dispatch.WebhookVerifier {
	svc := webhooks.NewWebhookService(option.WithWebhookSecret(secret))
	return webhookVerifier{svc: &svc}
}

type webhookVerifier struct{ svc *webhooks.WebhookService }

func (v webhookVerifier) Verify(body []byte, header http.Header) (*dispatch.WebhookEvent, error) {
	ev, err := v.svc.UnwrapWithTolerance(body, header, webhookTolerance)
	if err != nil {
		return nil, err
	}
	return &dispatch.WebhookEvent{ID: header.Get("webhook-id"), Type: ev.Type, ObjectID: ev.Data.ID}, nil
}
