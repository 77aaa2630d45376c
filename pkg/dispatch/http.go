package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/propagation"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Handler serves the dispatcher's HTTP API:
//
//	POST /v1/watch       start driving a platform object (202; 400 naming the field,
//	                     or 404 naming it when the platform has no such object)
//	GET  /v1/watch/{id}  the watch, its turns and each call's result
//	GET  /v1/turns, /v1/turns/{key}, /v1/turns/stream, /v1/functions,
//	     /v1/watches     the inspection API (see routeInspect)
//	POST /webhooks/openai signed platform webhooks (401 unless verified)
//	GET  /healthz        200 while the process runs
//	GET  /readyz         200 once NATS is connected and everything is provisioned
//	POST /mcp            the MCP front door: Streamable HTTP, stateless (mcp.go)
//
// Everything under /v1 (and /mcp and /ui) needs a caller: with
// [Options.Authenticator] set, a known bearer token (else 401 with
// WWW-Authenticate: Bearer); without it, a loopback client (else 401).
// A caller scoped to some teams sees other teams' calls in a watch without
// their results, and gets 403 for a watch that calls none of its teams'
// functions (see watchReport.seenBy).
func (d *Dispatcher) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/watch", d.postWatch)
	mux.HandleFunc("GET /v1/watch/{id}", d.getWatch)
	mux.HandleFunc("POST /webhooks/openai", d.postWebhook)
	mux.Handle("/mcp", d.mcpHandler())
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !d.Ready() || d.js.Conn().Status() != nats.CONNECTED {
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not ready"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	d.routeInspect(mux)
	return d.guard(d.whenReady(mux))
}

// whenReady answers 503 (with Retry-After) to every request but the health
// checks until Run is ready: before that the streams and buckets the
// handlers use may not be provisioned yet (JetStream still electing its
// leaders), and after Run stops they are no longer served. Found by the
// soak: a webhook or an MCP call reaching a dispatcher restarted under load
// dereferenced a bucket not yet set up.
func (d *Dispatcher) whenReady(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !d.Ready() && r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, map[string]any{"error": map[string]string{
				"message": "the dispatcher is starting or stopping; try again in a moment"}})
			return
		}
		next.ServeHTTP(w, r)
	})
}

// watchRequest is the body of POST /v1/watch. "agent" is a Foundry agent
// name, or an object with name and version.
type watchRequest struct {
	Platform     protocol.Platform `json:"platform"`
	SessionID    string            `json:"session_id"`
	ThreadID     string            `json:"thread_id"`
	RunID        string            `json:"run_id"`
	ResponseID   string            `json:"response_id"`
	Conversation string            `json:"conversation"`
	Model        string            `json:"model"`
	Agent        json.RawMessage   `json:"agent"`
}

func (req *watchRequest) ref() (Ref, error) {
	ref := Ref{Platform: req.Platform, SessionID: req.SessionID, ThreadID: req.ThreadID, RunID: req.RunID,
		ResponseID: req.ResponseID, Conversation: req.Conversation, Model: req.Model}
	if len(req.Agent) > 0 && string(req.Agent) != "null" {
		var name string
		if json.Unmarshal(req.Agent, &name) == nil {
			ref.Agent = &AgentReference{Name: name}
		} else {
			var a AgentReference
			dec := json.NewDecoder(strings.NewReader(string(req.Agent)))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&a); err != nil {
				return Ref{}, &FieldError{Field: "agent", Message: "agent must be a name or an object {\"name\":...,\"version\":...}"}
			}
			ref.Agent = &a
		}
	}
	return ref, ref.Validate()
}

// maxWatchBody bounds a POST /v1/watch body: a reference to a platform
// object and a little metadata.
const maxWatchBody = 64 << 10

func (d *Dispatcher) postWatch(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWatchBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body is larger than the %d KiB a watch request may be", maxWatchBody>>10))
		return
	}
	if err != nil {
		writeFieldError(w, &FieldError{Message: "could not read the body"})
		return
	}
	// A traceparent on the request makes the watch's turns its children.
	ctx := d.tel.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
	status, reply := d.watchRequest(ctx, body)
	writeJSON(w, status, reply)
}

// watchRequest starts a watch from the JSON of POST /v1/watch (or of a
// request on protocol.WatchSubject) and returns the HTTP status and body.
func (d *Dispatcher) watchRequest(ctx context.Context, body []byte) (int, any) {
	req, fe := decodeWatchRequest(body)
	if fe != nil {
		return http.StatusBadRequest, fieldErrorBody(fe)
	}
	ref, err := req.ref()
	if err != nil {
		var fe *FieldError
		if !errors.As(err, &fe) {
			fe = &FieldError{Message: err.Error()}
		}
		return http.StatusBadRequest, fieldErrorBody(fe)
	}
	watch, err := d.Watch(ctx, ref)
	if err != nil {
		var fe *FieldError
		switch {
		case errors.As(err, &fe) && errors.Is(err, ErrObjectNotFound):
			return http.StatusNotFound, fieldErrorBody(fe)
		case errors.As(err, &fe):
			return http.StatusBadRequest, fieldErrorBody(fe)
		case errors.Is(err, ErrNotRunning):
			return http.StatusServiceUnavailable, errorBody("the dispatcher is starting or stopping; retry shortly")
		case errors.Is(err, ErrUnavailable):
			d.log.WarnContext(ctx, "watch refused: JetStream unavailable", "err", err)
			return http.StatusServiceUnavailable, errorBody("JetStream is unavailable (a server may be failing over); retry shortly")
		default:
			d.log.ErrorContext(ctx, "watch failed", "err", err)
			return http.StatusInternalServerError, errorBody("could not start the watch")
		}
	}
	return http.StatusAccepted, map[string]string{"id": watch.ID, "status_url": "/v1/watch/" + watch.ID}
}

// watchRequestFields are the fields a watch request may have.
var watchRequestFields = map[string]bool{"platform": true, "session_id": true, "thread_id": true, "run_id": true,
	"response_id": true, "conversation": true, "model": true, "agent": true}

// decodeWatchRequest decodes the body of a watch request: one JSON object
// of known fields, each of the right type. A problem names its field.
func decodeWatchRequest(body []byte) (*watchRequest, *FieldError) {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil, &FieldError{Message: "the body is empty; send a JSON object"}
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, &FieldError{Message: "the body must be one JSON object"}
		}
		return nil, &FieldError{Message: "the body is not valid JSON: " + err.Error()}
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		if !watchRequestFields[name] {
			return nil, &FieldError{Field: name, Message: fmt.Sprintf("unknown field %q", name)}
		}
	}
	var req watchRequest
	if err := json.Unmarshal(body, &req); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return nil, &FieldError{Field: te.Field, Message: fmt.Sprintf("%s must be a %s", te.Field, te.Type)}
		}
		return nil, &FieldError{Message: "the body is not valid JSON: " + err.Error()}
	}
	return &req, nil
}

// watchReport is GET /v1/watch/{id}: the watch and each of its turns.
type watchReport struct {
	*Watch
	// AnswerRedacted says the answer is left out: it draws on the results
	// of calls the caller may not see.
	AnswerRedacted bool         `json:"answer_redacted,omitempty"`
	TurnDetails    []turnReport `json:"turn_details"`
}

type turnReport struct {
	Key         protocol.TurnKey `json:"key"`
	State       TurnState        `json:"state"`
	Calls       []callReport     `json:"calls"`
	Deadline    string           `json:"deadline"`
	ExpiresAt   string           `json:"expires_at"`
	SubmittedAt string           `json:"submitted_at,omitempty"`
	// TimeLeft is how long until the run expires, while the turn is open.
	TimeLeft string `json:"time_left,omitempty"`
	CutOff   bool   `json:"cut_off,omitempty"`
	Error    string `json:"error,omitempty"`
}

// callReport is one call of a turn and, once recorded, its result: what it
// returned (or its error), which executor produced it, on which attempt and
// how long that attempt ran.
type callReport struct {
	ID       string              `json:"id"`
	Function string              `json:"function"`
	Team     string              `json:"team"`
	Result   string              `json:"result"` // ok | error | pending | timed_out
	Error    *protocol.CallError `json:"error,omitempty"`
	// Output is the output of a successful call, whole, when it is at most
	// outputPreviewSize bytes; a larger one is shown by OutputPreview, its
	// first bytes. OutputBytes is the output's size either way.
	Output        *string `json:"output,omitempty"`
	OutputPreview string  `json:"output_preview,omitempty"`
	OutputBytes   *int    `json:"output_bytes,omitempty"`
	// Executor names the process that recorded the result
	// ("dispatcher/<name>" for a call failed without running).
	Executor string `json:"executor,omitempty"`
	// Attempts is how many times the call was run, the one that produced
	// the result included; absent when it never ran.
	Attempts   int    `json:"attempts,omitempty"`
	StartedAt  string `json:"started_at,omitempty"`
	FinishedAt string `json:"finished_at,omitempty"`
	// Duration is how long the attempt that produced the result ran.
	Duration string `json:"duration,omitempty"`
	// Redacted says the call belongs to a team the caller may not see:
	// only its id, function, team and result (ok, error, ...) are shown.
	Redacted bool `json:"redacted,omitempty"`
}

// outputPreviewSize bounds the output a watch report carries per call: an
// output up to this size is shown whole, a larger one by its first
// outputPreviewSize bytes (cut between characters) and its size, so a
// report stays small whatever the functions return.
const outputPreviewSize = 1 << 10

// describe fills in what res says about the call.
func (cr *callReport) describe(res *protocol.Result) {
	cr.Result, cr.Error = "ok", res.Error
	if res.Error != nil {
		cr.Result = "error"
	} else {
		n := len(res.Output)
		cr.OutputBytes = &n
		if n <= outputPreviewSize {
			out := res.Output
			cr.Output = &out
		} else {
			cr.OutputPreview = res.Output[:runeStart(res.Output, outputPreviewSize)]
		}
	}
	cr.Executor, cr.Attempts = res.Executor, res.Attempt
	if !res.FinishedAt.IsZero() {
		cr.FinishedAt = res.FinishedAt.Format(timeFormat)
	}
	if !res.StartedAt.IsZero() {
		cr.StartedAt = res.StartedAt.Format(timeFormat)
		if d := res.FinishedAt.Sub(res.StartedAt); d >= 0 {
			cr.Duration = d.Round(time.Microsecond).String()
		}
	}
}

// runeStart returns the largest n <= i at which s can be cut between
// characters.
func runeStart(s string, i int) int {
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

func (d *Dispatcher) getWatch(w http.ResponseWriter, r *http.Request) {
	status, reply := d.watchReport(r.Context(), r.PathValue("id"))
	if rep, ok := reply.(watchReport); ok {
		caller, _ := callerFrom(r.Context()) // none: sees no team
		status, reply = rep.seenBy(caller)
	}
	writeJSON(w, status, reply)
}

// seenBy is rep as caller may see it, and its HTTP status. An admin sees
// it all. A caller scoped to teams sees the watch and its turns; of calls
// to other teams' functions, only the id, function, team and result
// (ok, error, pending, timed_out): not their output, error, executor or
// timing. The answer, which draws on every result, is shown only when
// every call is the caller's. A watch that has calls and none of them the
// caller's is refused with 403: nothing in it is the caller's to see.
func (rep watchReport) seenBy(caller Caller) (int, any) {
	if caller.Admin {
		return http.StatusOK, rep
	}
	var mine, others int
	turns := make([]turnReport, len(rep.TurnDetails))
	for i, tr := range rep.TurnDetails {
		calls := make([]callReport, len(tr.Calls))
		for j, c := range tr.Calls {
			if caller.Sees(c.Team) {
				mine++
				calls[j] = c
				continue
			}
			others++
			calls[j] = callReport{ID: c.ID, Function: c.Function, Team: c.Team, Result: c.Result, Redacted: true}
		}
		tr.Calls = calls
		turns[i] = tr
	}
	if others > 0 && mine == 0 {
		return http.StatusForbidden, errorBody(fmt.Sprintf("watch %s calls no function of your teams (%s); only an admin token sees it",
			rep.ID, strings.Join(caller.Teams, ", ")))
	}
	rep.TurnDetails = turns
	if others > 0 {
		w := *rep.Watch
		rep.AnswerRedacted = w.Answer != ""
		w.Answer = ""
		rep.Watch = &w
	}
	return http.StatusOK, rep
}

// watchReport is the body of GET /v1/watch/{id} and its HTTP status.
func (d *Dispatcher) watchReport(ctx context.Context, id string) (int, any) {
	watch, err := whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (*Watch, error) { return d.WatchStatus(ctx, id) })
	switch {
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound, errorBody("no watch with id " + id)
	case errors.Is(err, ErrUnavailable):
		return http.StatusServiceUnavailable, errorBody("JetStream is unavailable (a server may be failing over); retry shortly")
	case err != nil:
		d.log.ErrorContext(ctx, "reading a watch failed", "watch", id, "err", err)
		return http.StatusInternalServerError, errorBody("could not read the watch")
	}
	rep := watchReport{Watch: watch, TurnDetails: []turnReport{}}
	for _, key := range watch.Turns {
		t, _, err := d.turns.get(ctx, key)
		if err != nil {
			continue
		}
		o := t.Outcome()
		tr := turnReport{Key: t.Key, State: t.State, Deadline: t.Deadline.Format(timeFormat), ExpiresAt: t.ExpiresAt.Format(timeFormat),
			CutOff: o.CutOff, Error: o.Error}
		if t.Open() {
			tr.TimeLeft = time.Until(t.ExpiresAt).Round(time.Millisecond).String()
		}
		if !o.SubmittedAt.IsZero() {
			tr.SubmittedAt = o.SubmittedAt.Format(timeFormat)
		}
		tr.Calls = d.callReports(ctx, t)
		rep.TurnDetails = append(rep.TurnDetails, tr)
	}
	return http.StatusOK, rep
}

const timeFormat = "2006-01-02T15:04:05.000Z07:00"

func fieldErrorBody(fe *FieldError) any {
	body := map[string]any{"message": strings.TrimPrefix(fe.Message, "dispatch: ")}
	if fe.Field != "" {
		body["field"] = fe.Field
	}
	return map[string]any{"error": body}
}

func errorBody(message string) any {
	return map[string]any{"error": map[string]any{"message": message}}
}

func writeFieldError(w http.ResponseWriter, fe *FieldError) {
	writeJSON(w, http.StatusBadRequest, fieldErrorBody(fe))
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, errorBody(message))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
