// Package jspub publishes to JetStream and waits for the acknowledgement,
// as jetstream.JetStream's PublishMsg does, reading the acknowledgement
// without reflection.
//
// A synchronous publication is a request; what it costs the client beyond
// the request itself is mostly encoding/json reading the answer, which is
// nearly always {"stream":"S","seq":N}. That form is read by hand; any
// other answer (an error, a domain, fields a later server adds) is read by
// encoding/json into the types nats.go uses, so callers see the same
// values and errors either way.
package jspub

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultTimeout bounds a publication whose context has no deadline: the
// default of a jetstream context's requests.
const DefaultTimeout = 5 * time.Second

// Publish sends m on nc, waits for JetStream's acknowledgement and returns
// the sequence the message is stored at (the first one's, for a
// duplicate). m's
// headers are the caller's to set (jetstream.ExpectedLastSubjSeqHeader,
// jetstream.MsgIDHeader...). As jetstream's PublishMsg: an answer of "no
// responders" (a stream leader being elected) is tried again
// jetstream.DefaultPubRetryAttempts times, jetstream.DefaultPubRetryWait
// apart, then is jetstream.ErrNoStreamResponse; an error the server answers
// is its *jetstream.APIError; an answer that is not an acknowledgement is
// jetstream.ErrInvalidJSAck. A context without a deadline is given
// DefaultTimeout, as jetstream gives its own: an acknowledgement lost with
// a server must not hold the caller forever.
func Publish(ctx context.Context, nc *nats.Conn, m *nats.Msg) (uint64, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	resp, err := nc.RequestMsgWithContext(ctx, m)
	for r := 0; errors.Is(err, nats.ErrNoResponders) && r < jetstream.DefaultPubRetryAttempts; r++ {
		wait := time.NewTimer(jetstream.DefaultPubRetryWait)
		select {
		case <-ctx.Done():
		case <-wait.C:
		}
		wait.Stop()
		resp, err = nc.RequestMsgWithContext(ctx, m)
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return 0, jetstream.ErrNoStreamResponse
	}
	if err != nil {
		return 0, err
	}
	return readAck(resp.Data)
}

// readAck reads a publication's answer as jetstream's PublishMsg does.
func readAck(data []byte) (uint64, error) {
	seq, err := readAsyncAck(data)
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return 0, fmt.Errorf("nats: %w", apiErr)
	}
	return seq, err
}

// readAsyncAck reads a publication's answer as jetstream's asynchronous
// publisher does: the server's error as it is.
func readAsyncAck(data []byte) (uint64, error) {
	if seq, _, ok := plainAck(data); ok {
		return seq, nil
	}
	var r ackResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return 0, jetstream.ErrInvalidJSAck
	}
	if r.Error != nil {
		return 0, r.Error
	}
	if r.PubAck == nil || r.Stream == "" {
		return 0, jetstream.ErrInvalidJSAck
	}
	return r.Sequence, nil
}

// ackResponse is the answer to a publication, as nats.go reads it.
type ackResponse struct {
	Type  string              `json:"type"`
	Error *jetstream.APIError `json:"error,omitempty"`
	*jetstream.PubAck
}

// plainAck reads {"stream":"S","seq":N} and {"stream":"S","seq":N,
// "duplicate": true}, exactly as the server writes them: S printable ASCII
// without escapes, N a plain unsigned integer. ok false: any other form.
// It allocates nothing.
func plainAck(b []byte) (seq uint64, duplicate, ok bool) {
	const (
		streamKey    = `{"stream":"`
		seqKey       = `","seq":`
		duplicateKey = `,"duplicate": true` // as the server writes it
	)
	rest, found := bytes.CutPrefix(b, []byte(streamKey))
	if !found {
		return 0, false, false
	}
	end := 0
	for end < len(rest) && rest[end] != '"' {
		if c := rest[end]; c < 0x20 || c == '\\' || c >= 0x80 {
			return 0, false, false
		}
		end++
	}
	stream := rest[:end]
	if rest, found = bytes.CutPrefix(rest[end:], []byte(seqKey)); !found || len(stream) == 0 {
		return 0, false, false
	}
	digits := 0
	for digits < len(rest) && '0' <= rest[digits] && rest[digits] <= '9' {
		if seq > (1<<63)/10 {
			return 0, false, false
		}
		seq = seq*10 + uint64(rest[digits]-'0')
		digits++
	}
	if digits == 0 || (digits > 1 && rest[0] == '0') {
		return 0, false, false
	}
	rest = rest[digits:]
	rest, duplicate = bytes.CutPrefix(rest, []byte(duplicateKey))
	if len(rest) != 1 || rest[0] != '}' {
		return 0, false, false
	}
	return seq, duplicate, true
}

// SetHeaders sets each key of kv (pairs of key and value) in h, making h
// when nil, and returns it. The values share one allocation, where
// nats.Header.Set makes one per value: a call's and a result's headers are
// set on every message.
func SetHeaders(h nats.Header, kv ...string) nats.Header {
	if len(kv)%2 != 0 {
		panic("jspub: SetHeaders needs pairs of key and value")
	}
	if h == nil {
		h = make(nats.Header, len(kv)/2+2) // room for a trace context
	}
	vals := make([]string, len(kv)/2)
	for i := range vals {
		vals[i] = kv[2*i+1]
		h[kv[2*i]] = vals[i : i+1 : i+1] // full: an Add copies, not overwrites
	}
	return h
}
