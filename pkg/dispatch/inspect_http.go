package dispatch

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The inspection API, read by the console and the CLI:
//
//	GET /v1/turns?open=1&team=&function=&platform=&outcome=&limit=
//	                       open turns (nearest deadline first) and recently
//	                       closed ones (newest first); see TurnList
//	GET /v1/turns/stream   the same filters: server-sent events, a
//	                       "snapshot" of the open turns, then a "turn"
//	                       event for every change of a turn record
//	GET /v1/turns/{key}    one turn with each call's result
//	GET /v1/functions      functions, executors, queues and figures
//	GET /v1/watches        active and recently ended watches
//	POST /v1/functions/{name}/accept {"definition_digest":...}
//	                       an admin accepts a function's changed definition
//	                       (with Options.DefinitionApproval; definitions.go)
//	GET /v1/tools?platform=&team=
//	                       the served functions as a platform's tool
//	                       definitions, each with its team (tools_export.go)
//
// A caller scoped to teams sees only turns calling its teams' functions
// (other calls only by id, function, team and result), its teams'
// functions, and watches driving its teams' calls; a caller scoped to
// tools only (Caller.ToolsOnly) reaches GET /v1/tools alone of these.
func (d *Dispatcher) routeInspect(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/turns", d.getTurns)
	mux.HandleFunc("GET /v1/turns/stream", d.streamTurns)
	mux.HandleFunc("GET /v1/turns/{key}", d.getTurn)
	mux.HandleFunc("GET /v1/functions", d.getFunctions)
	mux.HandleFunc("GET /v1/watches", d.getWatches)
	mux.HandleFunc("GET /v1/tools", d.getTools)
	mux.HandleFunc("POST /v1/functions/{name}/accept", d.postAccept)
}

// ParseTurnQuery reads a TurnQuery from the query of a request of caller:
// a problem names its parameter.
func ParseTurnQuery(caller Caller, r *http.Request) (TurnQuery, *FieldError) {
	v := r.URL.Query()
	q := TurnQuery{Team: v.Get("team"), Function: v.Get("function"), Platform: protocol.Platform(v.Get("platform")), Outcome: v.Get("outcome")}
	switch open := v.Get("open"); open {
	case "", "0", "false":
	case "1", "true":
		q.OpenOnly = true
	default:
		return q, &FieldError{Field: "open", Message: "open must be 1 or 0"}
	}
	switch q.Platform {
	case "", protocol.PlatformAgents, protocol.PlatformAssistants, protocol.PlatformResponses:
	default:
		return q, &FieldError{Field: "platform", Message: "platform must be agents, assistants or responses"}
	}
	switch q.Outcome {
	case "", "open", "submitted", "cut_off", "failed":
	default:
		return q, &FieldError{Field: "outcome", Message: "outcome must be open, submitted, cut_off or failed"}
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return q, &FieldError{Field: "limit", Message: "limit must be a whole number, 0 for no limit"}
		}
		q.Limit = n
		if n == 0 {
			q.Limit = -1
		}
	}
	if q.Team != "" && !caller.Sees(q.Team) {
		return q, &FieldError{Field: "team", Err: ErrOutOfScope, Message: fmt.Sprintf("team %s is not one of your teams (%s)", q.Team, strings.Join(caller.Teams, ", "))}
	}
	return q, nil
}

// CallerOf returns the caller the API's guard found for r; a request
// that did not pass the guard has none and sees nothing.
func CallerOf(r *http.Request) Caller {
	c, _ := callerFrom(r.Context())
	return c
}

func (d *Dispatcher) getTurns(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	q, fe := ParseTurnQuery(caller, r)
	if fe != nil {
		writeQueryError(w, fe)
		return
	}
	list, err := d.InspectTurns(r.Context(), caller, q)
	if err != nil {
		writeInspectError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (d *Dispatcher) getTurn(w http.ResponseWriter, r *http.Request) {
	v, err := d.InspectTurn(r.Context(), CallerOf(r), protocol.TurnKey(r.PathValue("key")))
	var fe *FieldError
	switch {
	case errors.As(err, &fe):
		writeFieldError(w, fe)
	case errors.Is(err, ErrNotFound):
		writeError(w, http.StatusNotFound, "no turn with key "+r.PathValue("key"))
	case err != nil:
		writeInspectError(w, err)
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

func (d *Dispatcher) getFunctions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"functions": d.InspectFunctions(r.Context(), CallerOf(r))})
}

func (d *Dispatcher) getWatches(w http.ResponseWriter, r *http.Request) {
	ws, err := d.InspectWatches(r.Context(), CallerOf(r))
	if err != nil {
		writeInspectError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"watches": ws})
}

// sseKeepAlive is how often an idle event stream gets a comment, so that
// proxies keep it open and a dead client is noticed.
const sseKeepAlive = 15 * time.Second

// streamTurns serves GET /v1/turns/stream: server-sent events. First a
// "snapshot" event (a TurnList of the open turns, its filters applied),
// then one "turn" event (a TurnView) for each change of a turn the filters
// select, open or closed. A client that falls behind gets a "reset" event
// and the stream ends; EventSource reconnects and starts from a snapshot.
// The stream ends when the dispatcher stops.
func (d *Dispatcher) streamTurns(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	q, fe := ParseTurnQuery(caller, r)
	if fe != nil {
		writeQueryError(w, fe)
		return
	}
	if err := d.inspect.ensure(r.Context()); err != nil {
		writeInspectError(w, err)
		return
	}
	ctx, stop := d.withRunContext(r.Context())
	defer stop()
	sub, cancel := d.inspect.subscribe() // before the snapshot: nothing falls in between
	defer cancel()
	q.OpenOnly = true
	list, err := d.InspectTurns(ctx, caller, q)
	if err != nil {
		writeInspectError(w, err)
		return
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	send := func(event string, v any) bool {
		b, _ := json.Marshal(v)
		if _, err := fmt.Fprintf(w, "event: %s\ndata: %s\n\n", event, b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if _, err := fmt.Fprint(w, "retry: 1000\n\n"); err != nil || !send("snapshot", list) {
		return
	}
	q.Outcome = "" // every change is sent: the client moves a closed turn out of the open list
	ping := time.NewTicker(sseKeepAlive)
	defer ping.Stop()
	for {
		select {
		case t := <-sub.ch:
			if !q.matches(caller, t) {
				continue
			}
			if !send("turn", view(caller, t, time.Now())) {
				return
			}
		case <-sub.lost:
			send("reset", map[string]string{"reason": "this client fell behind; reconnect for a fresh snapshot"})
			return
		case <-ping.C:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// writeQueryError answers a bad query parameter (400) or a team out of
// the caller's scope (403).
func writeQueryError(w http.ResponseWriter, fe *FieldError) {
	if errors.Is(fe, ErrOutOfScope) {
		writeJSON(w, http.StatusForbidden, fieldErrorBody(fe))
		return
	}
	writeFieldError(w, fe)
}

// writeInspectError answers an error of the inspection API.
func writeInspectError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, ErrOutOfScope):
		writeError(w, http.StatusForbidden, strings.TrimPrefix(err.Error(), ErrOutOfScope.Error()+": "))
	case errors.Is(err, ErrNotRunning):
		writeError(w, http.StatusServiceUnavailable, "the dispatcher is starting or stopping; retry shortly")
	default:
		writeError(w, http.StatusServiceUnavailable, strings.TrimPrefix(err.Error(), "dispatch: "))
	}
}
