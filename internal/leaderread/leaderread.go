// Package leaderread reads JetStream messages as their stream's leader
// holds them.
//
// A stream that allows direct gets (every KV bucket does, and so do
// toolrelay's result streams) answers them from any of its replicas, and a
// replica may lag its leader: it may answer with an earlier revision of a
// key, or "not found" for one the leader has already acknowledged. A
// nats-server replica starts answering once it has applied most of its log
// and goes on answering if it falls behind later, and requests prefer a
// responder on the server the client is connected to, so on a node that is
// catching up every direct get can be seconds behind. Code that decides on
// what it reads (take a turn in again, forget a turn, run a call again)
// must read what was acknowledged: the stream's leader answers
// STREAM.MSG.GET, and a newly elected leader holds every acknowledged
// message.
package leaderread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// DefaultTimeout bounds a read whose context has no deadline, as a
// jetstream context's requests are bounded.
const DefaultTimeout = 5 * time.Second

// LastFor returns the last message on subject in stream, as the stream's
// leader has it: jetstream.ErrMsgNotFound if there is none; nats.go's
// request errors (nats.ErrNoResponders while a leader is elected,
// context.DeadlineExceeded) as they come; an error the server answers as
// its *jetstream.APIError.
func LastFor(ctx context.Context, js jetstream.JetStream, stream, subject string) (*jetstream.RawStreamMsg, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	req, err := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return nil, err
	}
	resp, err := js.Conn().RequestWithContext(ctx, apiPrefix(js.Options())+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	return readMsg(resp.Data)
}

// apiPrefix is the JetStream API prefix js sends its requests under, with
// its final dot.
func apiPrefix(o jetstream.JetStreamOptions) string {
	switch {
	case o.APIPrefix != "":
		return strings.TrimSuffix(o.APIPrefix, ".") + "."
	case o.Domain != "":
		return "$JS." + o.Domain + ".API."
	default:
		return jetstream.DefaultAPIPrefix
	}
}

type msgGetResponse struct {
	Error   *jetstream.APIError `json:"error,omitempty"`
	Message *struct {
		Subject  string    `json:"subject"`
		Sequence uint64    `json:"seq"`
		Header   []byte    `json:"hdrs,omitempty"`
		Data     []byte    `json:"data,omitempty"`
		Time     time.Time `json:"time"`
	} `json:"message,omitempty"`
}

// readMsg reads a STREAM.MSG.GET answer as jetstream's GetMsg does.
func readMsg(data []byte) (*jetstream.RawStreamMsg, error) {
	var r msgGetResponse
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("leaderread: %w: %v", jetstream.ErrInvalidJSAck, err)
	}
	if r.Error != nil {
		if r.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, r.Error
	}
	if r.Message == nil {
		return nil, jetstream.ErrInvalidJSAck
	}
	m := &jetstream.RawStreamMsg{Subject: r.Message.Subject, Sequence: r.Message.Sequence, Data: r.Message.Data, Time: r.Message.Time}
	if len(r.Message.Header) > 0 {
		h, err := nats.DecodeHeadersMsg(r.Message.Header)
		if err != nil {
			return nil, fmt.Errorf("leaderread: headers of %s #%d: %w", m.Subject, m.Sequence, err)
		}
		m.Header = h
	}
	return m, nil
}

// KV returns kv with Get answered by its stream's leader; everything else
// is kv's own. js is the context kv was opened with.
func KV(js jetstream.JetStream, kv jetstream.KeyValue) jetstream.KeyValue {
	return &leaderKV{KeyValue: kv, js: js, stream: "KV_" + kv.Bucket(), pre: "$KV." + kv.Bucket() + "."}
}

type leaderKV struct {
	jetstream.KeyValue
	js          jetstream.JetStream
	stream, pre string
}

// Get returns the latest value of key as the bucket's leader has it, with
// the errors of jetstream's Get: jetstream.ErrKeyNotFound for a key never
// put, deleted, purged or expired; jetstream.ErrInvalidKey.
func (k *leaderKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if !validKey(key) {
		return nil, jetstream.ErrInvalidKey
	}
	m, err := LastFor(ctx, k.js, k.stream, k.pre+key)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, err
	}
	if removed(m.Header) {
		return nil, jetstream.ErrKeyNotFound
	}
	return &entry{bucket: k.Bucket(), key: key, value: m.Data, revision: m.Sequence, created: m.Time}, nil
}

// removed reports whether h marks a key deleted, purged or expired, as
// jetstream's Get reads it.
func removed(h nats.Header) bool {
	if len(h) == 0 {
		return false
	}
	switch h.Get("KV-Operation") {
	case "DEL", "PURGE":
		return true
	case "":
		switch h.Get(jetstream.MarkerReasonHeader) {
		case "MaxAge", "Purge", "Remove":
			return true
		}
	}
	return false
}

// validKey is jetstream's rule for keys: dot-separated tokens of letters,
// digits and -/_=, none empty.
func validKey(key string) bool {
	if key == "" || key[0] == '.' || key[len(key)-1] == '.' || strings.Contains(key, "..") {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '/', c == '_', c == '=', c == '.':
		default:
			return false
		}
	}
	return true
}

// entry is a value read by Get.
type entry struct {
	bucket, key string
	value       []byte
	revision    uint64
	created     time.Time
}

func (e *entry) Bucket() string                  { return e.bucket }
func (e *entry) Key() string                     { return e.key }
func (e *entry) Value() []byte                   { return e.value }
func (e *entry) Revision() uint64                { return e.revision }
func (e *entry) Created() time.Time              { return e.created }
func (e *entry) Delta() uint64                   { return 0 }
func (e *entry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }
