package jspub

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
)

// The server's acknowledgements, stored and duplicate, are in the form
// read by hand (a server that wrote them otherwise would leave every
// publication to encoding/json, correct but slower).
func TestTheServersAcknowledgementsAreReadByHand(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []bool{false, true} { // the second is a duplicate
		m := nats.NewMsg("orders.a")
		m.Header.Set(jetstream.MsgIDHeader, "id-1")
		resp, err := nc.RequestMsgWithContext(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		ack, ok := plainAck(resp.Data)
		if !ok || ack.Stream != "ORDERS" || ack.Sequence != 1 || ack.Duplicate != want {
			t.Errorf("%s read by hand as %+v, %v", resp.Data, ack, ok)
		}
	}
}
