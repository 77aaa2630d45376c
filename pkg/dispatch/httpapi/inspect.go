package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
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
//	                       definitions, each with its team (tools.go)
//
// A caller scoped to teams sees only turns calling its teams' functions
// (other calls only by id, function, team and result), its teams'
// functions, and watches driving its teams' calls; a caller scoped to
// tools only (Caller.ToolsOnly) reaches GET /v1/tools alone of these.
func (a *Handler) routeInspect(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/turns", a.getTurns)
	mux.HandleFunc("GET /v1/turns/stream", a.streamTurns)
	mux.HandleFunc("GET /v1/turns/{key}", a.getTurn)
	mux.HandleFunc("GET /v1/functions", a.getFunctions)
	mux.HandleFunc("GET /v1/watches", a.getWatches)
	mux.HandleFunc("GET /v1/tools", a.getTools)
	mux.HandleFunc("POST /v1/functions/{name}/accept", a.postAccept)
}

// ParseTurnQuery reads a [dispatch.TurnQuery] from the query of a request
// of caller: a problem names its parameter, and a team out of caller's
// scope wraps [dispatch.ErrOutOfScope].
func ParseTurnQuery(caller dispatch.Caller, r *http.Request) (dispatch.TurnQuery, *dispatch.FieldError) {
	v := r.URL.Query()
	q := dispatch.TurnQuery{Team: v.Get("team"), Function: v.Get("function"), Platform: protocol.Platform(v.Get("platform")), Outcome: v.Get("outcome")}
	switch open := v.Get("open"); open {
	case "", "0", "false":
	case "1", "true":
		q.OpenOnly = true
	default:
		return q, &dispatch.FieldError{Field: "open", Message: "open must be 1 or 0"}
	}
	if q.Platform != "" && q.Platform.Validate() != nil {
		return q, &dispatch.FieldError{Field: "platform", Message: "platform must be agents, assistants, responses or mcp"}
	}
	switch q.Outcome {
	case "", "open", "submitted", "cut_off", "failed":
	default:
		return q, &dispatch.FieldError{Field: "outcome", Message: "outcome must be open, submitted, cut_off or failed"}
	}
	if l := v.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 0 {
			return q, &dispatch.FieldError{Field: "limit", Message: "limit must be a whole number, 0 for no limit"}
		}
		q.Limit = n
		if n == 0 {
			q.Limit = -1
		}
	}
	if q.Team != "" && !caller.Sees(q.Team) {
		return q, &dispatch.FieldError{Field: "team", Err: dispatch.ErrOutOfScope, Message: fmt.Sprintf("team %s is not one of your teams (%s)", q.Team, strings.Join(caller.Teams, ", "))}
	}
	return q, nil
}

func (a *Handler) getTurns(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	q, fe := ParseTurnQuery(caller, r)
	if fe != nil {
		writeQueryError(w, fe)
		return
	}
	list, err := a.d.InspectTurns(r.Context(), caller, q)
	if err != nil {
		writeInspectError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (a *Handler) getTurn(w http.ResponseWriter, r *http.Request) {
	v, err := a.d.InspectTurn(r.Context(), CallerOf(r), protocol.TurnKey(r.PathValue("key")))
	var fe *dispatch.FieldError
	switch {
	case errors.As(err, &fe):
		writeFieldError(w, fe)
	case errors.Is(err, dispatch.ErrNotFound):
		writeError(w, http.StatusNotFound, "no turn with key "+r.PathValue("key"))
	case err != nil:
		writeInspectError(w, err)
	default:
		writeJSON(w, http.StatusOK, v)
	}
}

func (a *Handler) getFunctions(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"functions": a.d.InspectFunctions(r.Context(), CallerOf(r))})
}

func (a *Handler) getWatches(w http.ResponseWriter, r *http.Request) {
	ws, err := a.d.InspectWatches(r.Context(), CallerOf(r))
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
// The stream ends when the dispatcher stops. A caller holding
// MaxStreamsPerCaller streams already gets 429.
func (a *Handler) streamTurns(w http.ResponseWriter, r *http.Request) {
	caller := CallerOf(r)
	q, fe := ParseTurnQuery(caller, r)
	if fe != nil {
		writeQueryError(w, fe)
		return
	}
	if !a.streams.acquire(caller.Name) {
		a.tooManyStreams(w, caller)
		return
	}
	defer a.streams.release(caller.Name)
	w = a.streaming(w)
	list, feed, err := a.d.FollowTurns(r.Context(), caller, q)
	if err != nil {
		writeInspectError(w, err)
		return
	}
	defer feed.Close()
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
	for {
		ctx, cancel := context.WithTimeout(r.Context(), sseKeepAlive)
		v, err := feed.Next(ctx)
		cancel()
		switch {
		case err == nil:
			if !send("turn", v) {
				return
			}
		case errors.Is(err, dispatch.ErrFellBehind):
			send("reset", map[string]string{"reason": "this client fell behind; reconnect for a fresh snapshot"})
			return
		case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
			if _, err := fmt.Fprint(w, ": keep-alive\n\n"); err != nil || rc.Flush() != nil {
				return
			}
		default: // the client went away, or the dispatcher stops
			return
		}
	}
}

// tooManyStreams answers 429 to a caller holding its limit of streams.
func (a *Handler) tooManyStreams(w http.ResponseWriter, caller dispatch.Caller) {
	w.Header().Set("Retry-After", "5")
	writeError(w, http.StatusTooManyRequests, a.streamsMessage(caller))
}

func (a *Handler) streamsMessage(caller dispatch.Caller) string {
	return fmt.Sprintf("%s holds %d event streams already, the most one caller may (TOOLRELAY_MAX_STREAMS_PER_CALLER); close one first",
		caller.Name, a.opts.MaxStreamsPerCaller)
}

// writeQueryError answers a bad query parameter (400) or a team out of
// the caller's scope (403).
func writeQueryError(w http.ResponseWriter, fe *dispatch.FieldError) {
	if errors.Is(fe, dispatch.ErrOutOfScope) {
		writeJSON(w, http.StatusForbidden, fieldErrorBody(fe))
		return
	}
	writeFieldError(w, fe)
}

// writeInspectError answers an error of the inspection API.
func writeInspectError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, dispatch.ErrOutOfScope):
		writeError(w, http.StatusForbidden, strings.TrimPrefix(err.Error(), dispatch.ErrOutOfScope.Error()+": "))
	case errors.Is(err, dispatch.ErrNotRunning):
		writeError(w, http.StatusServiceUnavailable, "the dispatcher is starting or stopping; retry shortly")
	default:
		writeError(w, http.StatusServiceUnavailable, strings.TrimPrefix(err.Error(), "dispatch: "))
	}
}
