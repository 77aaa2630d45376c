package jsretry

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestMayPassTellsFailoverFromRefusal(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nats.ErrTimeout, true},
		{nats.ErrNoResponders, true},
		{fmt.Errorf("get: %w", context.DeadlineExceeded), true},
		{jetstream.ErrNoStreamResponse, true},
		{jetstream.ErrTooManyStalledMsgs, true},
		{jetstream.ErrAsyncPublishTimeout, true},
		{nats.ErrDisconnected, true},
		{&jetstream.APIError{Code: http.StatusInternalServerError, ErrorCode: 10077, Description: "maximum messages exceeded"}, false},
		{&jetstream.APIError{Code: http.StatusBadRequest, ErrorCode: jetstream.JSErrCodeStreamMessageExceedsMaximum}, false},
		{&jetstream.APIError{Code: http.StatusServiceUnavailable, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		// The server's own code, by its name there.
		{&jetstream.APIError{Code: http.StatusConflict, ErrorCode: jetstream.ErrorCode(server.JSStreamDuplicateMessageConflict), Description: "duplicate message id is in process"}, true},
		{&jetstream.APIError{Code: http.StatusBadRequest, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, false},
		{jetstream.ErrKeyNotFound, false},
		{context.Canceled, false},
		{errors.New("permission denied"), false},
	} {
		if got := MayPass(tc.err); got != tc.want {
			t.Errorf("MayPass(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
