// Package firstwins records call results so that the first result of a call
// wins: the one place where the dispatcher (failures decided at intake) and
// executors (outcomes of runs) write results.
//
// The results stream keeps one message per subject and refuses a second
// with "wrong last sequence" (a publish expecting the subject to be empty),
// and a repeat of the same publication is deduplicated by its message ID,
// the call key. Both mean a result is already recorded, which is success
// for a writer that only needs some result to exist.
//
// It may import pkg/protocol, internal/jspub and nats.go; pkg/dispatch and
// pkg/exec use it, and it imports neither.
package firstwins

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Record publishes res on its result subject, on nc, unless a result of
// the call is recorded already, which is not an error. header (may be nil)
// carries trace context; Record adds the call key, and ttl (the call's
// protocol.Call.ResultTTL; 0: none) as the result's Nats-TTL. A result
// stream that does not allow per-message TTLs (created by a dispatcher
// older than them, and not yet updated) refuses a TTL; the result is then
// recorded without one, kept for the stream's MaxAge. The acknowledgement
// is read by jspub.
func Record(ctx context.Context, nc *nats.Conn, res *protocol.Result, header nats.Header, ttl time.Duration) error {
	data, err := protocol.EncodeResult(res)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: res.Subject(), Data: data, Header: jspub.SetHeaders(header,
		protocol.HeaderCallKey, string(res.Key),
		jetstream.MsgIDHeader, protocol.ResultMsgID(res.Key),
		jetstream.ExpectedLastSubjSeqHeader, "0")}
	if ttl > 0 {
		m.Header.Set(jetstream.MsgTTLHeader, ttl.String())
	}
	_, err = jspub.Publish(ctx, nc, m)
	if ttl > 0 && isAPIError(err, errCodeMsgTTLDisabled) {
		m.Header.Del(jetstream.MsgTTLHeader)
		_, err = jspub.Publish(ctx, nc, m)
	}
	if stored(err) {
		return nil
	}
	if Lost(err) {
		// Another write of this subject is in flight on a replicated
		// stream, from a writer with another message ID or none. It may
		// never be stored (its leader can fail before quorum), so only a
		// later try can tell: it is deduplicated, refused because a
		// result is stored, or stores this one.
		return fmt.Errorf("firstwins: another result of %s is still being stored: %w", res.Key, err)
	}
	return err
}

// errCodeMsgTTLDisabled is the server's answer to a Nats-TTL on a stream
// that does not allow per-message TTLs ("per-message TTL is disabled").
const errCodeMsgTTLDisabled jetstream.ErrorCode = 10166

// isAPIError reports whether err is JetStream's answer code.
func isAPIError(err error, code jetstream.ErrorCode) bool {
	var apiErr *jetstream.APIError
	return err != nil && errors.As(err, &apiErr) && apiErr.ErrorCode == code
}

// stored reports whether err says the subject holds a message already: the
// server compared the subject's last sequence and found one.
func stored(err error) bool {
	return isAPIError(err, jetstream.JSErrCodeStreamWrongLastSequence)
}

// Lost reports whether err says a publication conditioned on a subject's
// last sequence lost its race: another message got there first (error
// code 10071), or, on a replicated (R>1) stream, another conditioned write
// of the subject is still in flight (10164). A compare-and-set reads the
// subject again either way. 10164 does not prove the other write will be
// stored, so Record does not take it for a recorded result.
func Lost(err error) bool {
	if err == nil {
		return false // before apiErr, which escapes: most publications succeed
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	switch apiErr.ErrorCode {
	case jetstream.JSErrCodeStreamWrongLastSequence, jetstream.JSErrCodeStreamWrongLastSequenceConstant:
		return true
	}
	return false
}

// Recorded reports whether a result of key, owned by team, is recorded. It
// asks by direct get under apiPrefix (protocol.DefaultAPIPrefix, or
// protocol.ControlAPIPrefix from a team's own account), so it needs no
// stream handle: a team's credentials reach this one subject of the
// control plane's API and nothing else.
func Recorded(ctx context.Context, nc *nats.Conn, apiPrefix, team string, key protocol.CallKey) (bool, error) {
	m, err := nc.RequestWithContext(ctx, protocol.ResultGetSubject(apiPrefix, team, key), nil)
	if err != nil {
		return false, fmt.Errorf("firstwins: look up the result of %s: %w", key, err)
	}
	switch status := m.Header.Get("Status"); {
	case status == "" && m.Header.Get("Nats-Sequence") != "":
		return true, nil
	case status == "404":
		return false, nil
	default:
		return false, fmt.Errorf("firstwins: look up the result of %s: status %s %s", key, status, m.Header.Get("Description"))
	}
}
