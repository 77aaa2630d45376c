package watch

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The watch API over NATS request-reply, for clients already on NATS:
// protocol.WatchSubject takes the body of POST /v1/watch and answers with
// its JSON plus "status" (the HTTP status it would have had);
// protocol.WatchStatusSubject takes {"id":"..."} and answers like
// GET /v1/watch/{id}. Replicas share a queue group, so one answers.

// queueGroup is the queue group of the dispatcher replicas.
const queueGroup = "toolrelay-dispatchers"

// natsRequestTimeout bounds the work of one watch request (or status
// request) made over NATS; the requester's own timeout is usually shorter.
const natsRequestTimeout = 10 * time.Second

func (s *Service) serveNATS(ctx context.Context) (stop func(), err error) {
	nc := s.js.Conn()
	reply := func(m *nats.Msg, status int, body any) {
		b, _ := json.Marshal(body)
		var obj map[string]any
		if json.Unmarshal(b, &obj) == nil {
			obj["status"] = status
			b, _ = json.Marshal(obj)
		}
		_ = m.Respond(b)
	}
	watch, err := nc.QueueSubscribe(protocol.WatchSubject, queueGroup, func(m *nats.Msg) {
		rctx, cancel := context.WithTimeout(ctx, natsRequestTimeout)
		defer cancel()
		rctx = otelconv.Propagator.Extract(rctx, protocol.HeaderCarrier(m.Header))
		status, body := s.d.AnswerWatchRequest(rctx, m.Data)
		reply(m, status, body)
	})
	if err != nil {
		return nil, err
	}
	status, err := nc.QueueSubscribe(protocol.WatchStatusSubject, queueGroup, func(m *nats.Msg) {
		var req struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(m.Data, &req); err != nil || req.ID == "" {
			reply(m, http.StatusBadRequest, map[string]any{"error": map[string]any{"message": `send {"id":"<watch id>"}`, "field": "id"}})
			return
		}
		rctx, cancel := context.WithTimeout(ctx, natsRequestTimeout)
		defer cancel()
		code, body := s.d.AnswerWatchStatus(rctx, dispatch.Caller{Admin: true}, req.ID)
		reply(m, code, body)
	})
	if err != nil {
		_ = watch.Unsubscribe()
		return nil, err
	}
	return func() { _ = watch.Drain(); _ = status.Drain() }, nil
}
