package jspub

import (
	"context"
	"encoding/json"
	"errors"
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
		seq, duplicate, ok := plainAck(resp.Data)
		if !ok || seq != 1 || duplicate != want {
			t.Errorf("%s read by hand as %d, duplicate %v, %v", resp.Data, seq, duplicate, ok)
		}
	}
}

// Whatever the hand-made reading takes, encoding/json reads the same way
// into the types nats.go uses; the rest goes to encoding/json.
func FuzzReadAckAgreesWithEncodingJSON(f *testing.F) {
	f.Add([]byte(`{"stream":"ORDERS","seq":42}`))
	f.Add([]byte(`{"stream":"ORDERS","seq":42,"duplicate": true}`))
	f.Add([]byte(`{"stream":"ORDERS","domain":"hub","seq":7}`))
	f.Add([]byte(`{"error":{"code":400,"err_code":10071,"description":"wrong last sequence: 3"},"stream":"ORDERS","seq":0}`))
	f.Add([]byte(`{"stream":"","seq":1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		if seq, duplicate, ok := plainAck(data); ok {
			var r ackResponse
			if err := json.Unmarshal(data, &r); err != nil || r.Error != nil || r.PubAck == nil || r.Stream == "" ||
				r.Sequence != seq || r.Duplicate != duplicate {
				t.Fatalf("%q read by hand as %d, duplicate %v; encoding/json reads %+v, %v", data, seq, duplicate, r.PubAck, err)
			}
		}
		seq, err := readAck(data)
		var r ackResponse
		jerr := json.Unmarshal(data, &r)
		switch {
		case jerr != nil:
			if !errors.Is(err, jetstream.ErrInvalidJSAck) {
				t.Fatalf("%q is not JSON (%v) but read as %d, %v", data, jerr, seq, err)
			}
		case r.Error != nil:
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != r.Error.ErrorCode {
				t.Fatalf("%q: %v; want the server's error %v", data, err, r.Error)
			}
		case r.PubAck == nil || r.Stream == "":
			if !errors.Is(err, jetstream.ErrInvalidJSAck) {
				t.Fatalf("%q: %d, %v; want ErrInvalidJSAck", data, seq, err)
			}
		case err != nil || seq != r.Sequence:
			t.Fatalf("%q read as %d, %v; encoding/json reads %+v", data, seq, err, r.PubAck)
		}
	})
}
