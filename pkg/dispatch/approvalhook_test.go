package dispatch_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/openaiplatform"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Each call held for approval is POSTed to the approval webhook, signed as
// Standard Webhooks sign: the OpenAI SDK's verifier accepts it. A delivery
// the endpoint refuses is tried again.
func TestApprovalWebhookIsSignedAndRetried(t *testing.T) {
	t.Parallel()
	const secret = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
	type delivery struct {
		header http.Header
		body   []byte
	}
	got := make(chan delivery, 4)
	var tries atomic.Int32
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if tries.Add(1) == 1 {
			http.Error(w, "not yet", http.StatusServiceUnavailable)
			return
		}
		got <- delivery{r.Header.Clone(), body}
	}))
	t.Cleanup(hs.Close)
	e := newEnv(t)
	e.declareSpec(refundSpec(5*time.Second), "billing-exec", "b1")
	e.serve("billing", []string{"refund"}, func(*protocol.Call) (string, bool) { return `"refunded"`, false })
	d, _ := e.dispatcher(dispatch.Options{ApprovalWebhookURL: hs.URL + "/hook", ApprovalWebhookSecret: secret})
	started, err := d.StartCall(t.Context(), "hook-test", dispatch.DirectCall{Function: "refund",
		Arguments: json.RawMessage(`{"order":"o-1","amount":500}`), Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	var dl delivery
	select {
	case dl = <-got:
	case <-time.After(15 * time.Second):
		t.Fatalf("no approval webhook delivered in 15 s (%d tries)", tries.Load())
	}
	verifier := openai.NewClient(option.WithAPIKey("unused"))
	if err := verifier.Webhooks.VerifySignature(dl.body, dl.header, option.WithWebhookSecret(secret)); err != nil {
		t.Errorf("the SDK's verifier refuses the webhook: %v", err)
	}
	var a dispatch.Approval
	if err := json.Unmarshal(dl.body, &a); err != nil || a.Turn != started.Key || a.State != dispatch.ApprovalAwaiting || a.Function != "refund" {
		t.Errorf("webhook body %s (%v), want a call of turn %s awaiting approval", dl.body, err, started.Key)
	}
	if id := dl.header.Get("webhook-id"); id != string(a.CallKey)+".requested" {
		t.Errorf("webhook-id %q", id)
	}
	if n := tries.Load(); n != 2 {
		t.Errorf("%d tries, want the refused one and one more", n)
	}
}

// The approval webhook's settings are checked when the dispatcher is made.
func TestApprovalWebhookSettingsAreChecked(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	for _, tc := range []struct{ url, secret, want string }{
		{"https://bot.example/hook", "", "needs a secret"},
		{"", "whsec_AAEC", "no URL"},
		{"bot.example/hook", "s3cret", "absolute http or https URL"},
		{"https://bot.example/hook", "whsec_not base64!", "not base64"},
	} {
		_, err := dispatch.New(js, openaiplatform.New(openai.NewClient()), dispatch.Options{ApprovalWebhookURL: tc.url, ApprovalWebhookSecret: tc.secret})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("url %q secret %q: %v, want an error saying %q", tc.url, tc.secret, err, tc.want)
		}
	}
}
