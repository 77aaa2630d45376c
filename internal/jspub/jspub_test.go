package jspub_test

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/natstest"
)

// Against a real server, every kind of answer comes back as jetstream's
// own PublishMsg returns it: an acknowledgement, a duplicate, a failed
// expectation (the server's error, with its code) and no stream at all.
func TestPublishAnswersAsJetStreamDoes(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	// Two streams alike: jetstream publishes to one, jspub to the other,
	// the same messages in the same order.
	for _, name := range []string{"VIA_JETSTREAM", "VIA_JSPUB"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
			t.Fatal(err)
		}
	}
	msg := func(stream, subject, id, lastSeq string) *nats.Msg {
		m := nats.NewMsg(stream + "." + subject)
		m.Data = []byte("x")
		if id != "" {
			m.Header.Set(jetstream.MsgIDHeader, id)
		}
		if lastSeq != "" {
			m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, lastSeq)
		}
		return m
	}
	for _, c := range []struct {
		name             string
		subject, id, seq string
	}{
		{"stored", "a", "", ""},
		{"with a message ID", "b", "id-1", ""},
		{"a duplicate", "b", "id-1", ""},
		{"expected last sequence met", "c", "", "0"},
		{"expected last sequence missed", "c", "", "0"},
	} {
		want, wantErr := js.PublishMsg(ctx, msg("VIA_JETSTREAM", c.subject, c.id, c.seq))
		got, err := jspub.Publish(ctx, nc, msg("VIA_JSPUB", c.subject, c.id, c.seq))
		if got != nil && got.Stream == "VIA_JSPUB" {
			got.Stream = "VIA_JETSTREAM"
		}
		if !reflect.DeepEqual(got, want) || !sameError(err, wantErr) {
			t.Errorf("%s: jspub %+v, %v; jetstream %+v, %v", c.name, got, err, want, wantErr)
		}
	}
	if _, err := jspub.Publish(ctx, nc, msg("NOWHERE", "a", "", "")); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("no stream: %v; want ErrNoStreamResponse", err)
	}
}

func sameError(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	var x, y *jetstream.APIError
	if errors.As(a, &x) != errors.As(b, &y) {
		return false
	}
	return x == nil || (x.ErrorCode == y.ErrorCode && x.Code == y.Code && a.Error() == b.Error())
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
		got, err := jspub.ReadAck(data)
		var r struct {
			Error *jetstream.APIError `json:"error,omitempty"`
			*jetstream.PubAck
		}
		jerr := json.Unmarshal(data, &r)
		switch {
		case jerr != nil:
			if !errors.Is(err, jetstream.ErrInvalidJSAck) {
				t.Fatalf("%q is not JSON (%v) but read as %+v, %v", data, jerr, got, err)
			}
		case r.Error != nil:
			var apiErr *jetstream.APIError
			if !errors.As(err, &apiErr) || apiErr.ErrorCode != r.Error.ErrorCode {
				t.Fatalf("%q: %v; want the server's error %v", data, err, r.Error)
			}
		case r.PubAck == nil || r.Stream == "":
			if !errors.Is(err, jetstream.ErrInvalidJSAck) {
				t.Fatalf("%q: %+v, %v; want ErrInvalidJSAck", data, got, err)
			}
		default:
			if err != nil || !reflect.DeepEqual(got, r.PubAck) {
				t.Fatalf("%q read as %+v, %v; encoding/json reads %+v", data, got, err, r.PubAck)
			}
		}
	})
}
