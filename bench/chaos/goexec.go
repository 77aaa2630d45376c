package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

// The soak's Go executor: this program started as `chaos -child-executor`,
// serving team orders' Go functions through pkg/exec, as a team's own
// executor binary would.
//
//	refund  side effects, with Reconcile: after a crash mid-call, it asks
//	        the effect log whether the refund happened and answers from it
//	        instead of refunding twice
//	tally   a plain Go function
func runGoExecutor(ctx context.Context, fnURL string) error {
	auth, err := nats.NkeyOptionFromSeed(os.Getenv("NATS_NKEY"))
	if err != nil {
		return err
	}
	nc, js, err := exec.Connect(ctx, os.Getenv("NATS_URL"), exec.ConnectOptions{Name: "chaos-go-executor", NATS: []nats.Option{auth}})
	if err != nil {
		return err
	}
	defer nc.Close()
	ex, err := exec.New(js, "orders", exec.Options{Name: os.Getenv("TOOLRELAY_EXECUTOR_NAME"), AckWait: ackWait,
		ShutdownTimeout: 5 * time.Second, ControlAPIPrefix: os.Getenv("TOOLRELAY_CONTROL_API_PREFIX")})
	if err != nil {
		return err
	}
	refund := exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		return post(ctx, fnURL+"/refund", inv.Call.CallID)
	})
	if err := ex.Register(exec.Function{Name: "refund", SideEffects: true, Timeout: 10 * time.Second,
		Parameters: json.RawMessage(`{"type":"object","properties":{"order":{"type":"string"}},"required":["order"]}`),
		Handler:    refund,
		Reconcile: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			out, err := get(ctx, fnURL+"/refunded?id="+inv.Call.CallID)
			if errors.Is(err, errNotFound) {
				return nil, exec.ErrDidNotRun // it did not happen: refund now
			}
			return out, err
		})}); err != nil {
		return err
	}
	if err := ex.Register(exec.Function{Name: "tally", Parameters: json.RawMessage(`{"type":"object"}`),
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			return []byte(fmt.Sprintf("tally %d", len(inv.Call.Arguments))), nil
		})}); err != nil {
		return err
	}
	return ex.Run(ctx) // it logs "executor serving" once declared, which the fleet waits for
}

var errNotFound = errors.New("not found")

func post(ctx context.Context, url, callID string) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, nil)
	req.Header.Set("Toolrelay-Call-Id", callID)
	return do(req)
}

func get(ctx context.Context, url string) ([]byte, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	return do(req)
}

func do(req *http.Request) ([]byte, error) {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, exec.Retryable(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	switch {
	case resp.StatusCode == http.StatusNotFound:
		return nil, errNotFound
	case resp.StatusCode >= 300:
		return nil, fmt.Errorf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	return b, nil
}
