package exec

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// HTTPHandler POSTs each call's arguments JSON to endpoint (for a custom
// tool, the model's text as it is, as text/plain); a 2xx response
// body is the output, anything else is a failed call carrying the status and
// the start of the body. 429, 502, 503, 504 and connection failures are
// retryable. 409 Conflict and 422 Unprocessable Content are expected
// refusals ([ErrRefused]: not retried, no dead letter): a service answers
// them to decline a request it understood ("already shipped", "no such
// customer"). Other 4xx, 400 and 404 included, leave a dead letter, since
// they also come from a wrong URL or a request the service no longer
// understands, which an operator must fix. The request is cut at the call's deadline. It
// carries Idempotency-Key (the call key, stable across redeliveries),
// Toolrelay-Call-Id, Toolrelay-Function and Toolrelay-Deadline headers.
// A nil client means http.DefaultClient.
func HTTPHandler(endpoint string, client *http.Client) (Handler, error) {
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("exec: http url %q must be an absolute http(s) URL", endpoint)
	}
	if client == nil {
		client = http.DefaultClient
	}
	return HandlerFunc(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		reqBody, contentType := io.Reader(bytes.NewReader(inv.Call.Arguments)), "application/json"
		if input, ok := inv.Input(); ok {
			reqBody, contentType = strings.NewReader(input), "text/plain; charset=utf-8"
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, reqBody)
		if err != nil {
			return nil, err
		}
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Idempotency-Key", string(inv.Call.Key))
		req.Header.Set("Toolrelay-Call-Id", inv.Call.CallID)
		req.Header.Set("Toolrelay-Function", inv.Call.Function)
		req.Header.Set("Toolrelay-Deadline", inv.Call.Deadline.Format(time.RFC3339Nano))
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, Retryable(fmt.Errorf("%s is unreachable: %v", inv.Call.Function, err))
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, protocol.MaxOutputSize+1))
		if err != nil {
			return nil, fmt.Errorf("%s: reading its answer failed: %v", inv.Call.Function, err)
		}
		if resp.StatusCode < 200 || resp.StatusCode > 299 {
			msg := strings.TrimSpace(string(body))
			err := fmt.Errorf("%s failed (HTTP %d): %s", inv.Call.Function, resp.StatusCode, protocol.Truncate(msg, 2048))
			switch resp.StatusCode {
			case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
				return nil, Retryable(err)
			case http.StatusConflict, http.StatusUnprocessableEntity:
				return nil, Refuse(err)
			}
			return nil, err
		}
		return body, nil
	}), nil
}
