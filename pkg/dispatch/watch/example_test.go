package watch_test

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/watch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// An embedder's dispatcher drives watches once a watch driver is attached.
func Example() {
	var (
		ctx       context.Context     // the embedder's
		js        jetstream.JetStream // the account's own JetStream
		platforms []dispatch.Platform // e.g. openaiplatform.New(client)
	)
	d, err := dispatch.New(js, platforms, dispatch.Options{})
	if err != nil {
		return
	}
	watch.New(d, js)
	go func() { _ = d.Run(ctx) }()
	// Once d is ready:
	w, err := d.Watch(ctx, dispatch.Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_123"})
	if err == nil {
		_, _ = d.WatchStatus(ctx, w.ID)
	}
}
