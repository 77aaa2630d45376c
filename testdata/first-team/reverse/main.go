// Command reverse is a Go executor of the orders team serving reverse_text,
// for docs/first-team.md. It joins any dispatcher's JetStream (NATS_URL,
// default nats://127.0.0.1:4222), dispatcher dev's included.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	nc, js, err := exec.Connect(ctx, cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222"), exec.ConnectOptions{Name: "reverse"})
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	ex, err := exec.New(js, "orders", exec.Options{})
	if err != nil {
		log.Fatal(err)
	}
	err = ex.Register(exec.Function{
		Name:        "reverse_text",
		Description: "Reverse a text, character by character.",
		Parameters:  json.RawMessage(`{"type":"object","properties":{"text":{"type":"string"}},"required":["text"],"additionalProperties":false}`),
		Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
			var args struct{ Text string }
			if err := json.Unmarshal(inv.Call.Arguments, &args); err != nil {
				return nil, fmt.Errorf("%w: %v", exec.ErrInvalidArguments, err)
			}
			r := []rune(args.Text)
			for i, j := 0, len(r)-1; i < j; i, j = i+1, j-1 {
				r[i], r[j] = r[j], r[i]
			}
			return json.Marshal(string(r))
		}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := ex.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
