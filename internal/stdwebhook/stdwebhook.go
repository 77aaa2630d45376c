// Package stdwebhook signs webhooks as Standard Webhooks
// (https://www.standardwebhooks.com) and OpenAI's do: webhook-id,
// webhook-timestamp and webhook-signature, "v1," and the base64
// HMAC-SHA256 of "<id>.<timestamp>.<body>" under the secret, which is
// "whsec_" and the key in base64, or the key itself.
package stdwebhook

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Key returns the HMAC key of secret. Errors: a "whsec_" secret that is
// not base64, or an empty key.
func Key(secret string) ([]byte, error) {
	key := []byte(secret)
	if rest, ok := strings.CutPrefix(secret, "whsec_"); ok {
		var err error
		if key, err = base64.StdEncoding.Strict().DecodeString(rest); err != nil {
			return nil, fmt.Errorf("stdwebhook: the secret after whsec_ is not base64: %w", err)
		}
	}
	if len(key) == 0 {
		return nil, errors.New("stdwebhook: the secret is empty")
	}
	return key, nil
}

// Sign returns the headers of body sent as webhook id at the time at,
// Content-Type included.
func Sign(secret, id string, at time.Time, body []byte) (http.Header, error) {
	key, err := Key(secret)
	if err != nil {
		return nil, err
	}
	ts := strconv.FormatInt(at.Unix(), 10)
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.", id, ts)
	mac.Write(body)
	h := http.Header{}
	h.Set("webhook-id", id)
	h.Set("webhook-timestamp", ts)
	h.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(mac.Sum(nil)))
	h.Set("Content-Type", "application/json")
	return h, nil
}
