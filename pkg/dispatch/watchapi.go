package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The watch API, served on two transports: POST /v1/watch and GET
// /v1/watch/{id} (package httpapi), and protocol.WatchSubject and
// protocol.WatchStatusSubject on NATS (package watch). Its answers are the
// same on both: an HTTP status and a JSON body.

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

// AnswerWatchRequest starts a watch from the JSON body of a watch request
// (POST /v1/watch, or a request on protocol.WatchSubject) and returns the
// answer's HTTP status and its body, a value encoding/json encodes: 202
// with {"id","status_url"}; 400 naming the field of a bad request; 404
// naming it when the platform has no such object; 503 while the
// dispatcher is starting or stopping or JetStream is unavailable; 501
// when no [WatchDriver] is attached; 500 otherwise. A traceparent in ctx
// makes the watch's turns its children.
func (d *Dispatcher) AnswerWatchRequest(ctx context.Context, body []byte) (status int, reply any) {
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
		case errors.Is(err, ErrNoWatchDriver):
			return http.StatusNotImplemented, errorBody("this dispatcher drives no watches")
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
	Calls       []CallReport     `json:"calls"`
	Deadline    string           `json:"deadline"`
	ExpiresAt   string           `json:"expires_at"`
	SubmittedAt string           `json:"submitted_at,omitempty"`
	// TimeLeft is how long until the run expires, while the turn is open.
	TimeLeft string `json:"time_left,omitempty"`
	CutOff   bool   `json:"cut_off,omitempty"`
	Error    string `json:"error,omitempty"`
}

// CallReport is one call of a turn as the API shows it (GET
// /v1/watch/{id}, GET /v1/turns/{key}) and, once recorded, its result:
// what it returned (or its error), which executor produced it, on which
// attempt and how long that attempt ran.
type CallReport struct {
	ID       string              `json:"id"`
	Function string              `json:"function"`
	Team     string              `json:"team"`
	Result   string              `json:"result"` // ok | error | pending | timed_out | expired (a closed turn's, past its keep)
	Error    *protocol.CallError `json:"error,omitempty"`
	// Output is the output of a successful call, whole, when it is at most
	// 1 KiB; a larger one is shown by OutputPreview, its first bytes.
	// OutputBytes is the output's size either way.
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
func (cr *CallReport) describe(res *protocol.Result) {
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

// AnswerWatchStatus returns the answer to a watch status request (GET
// /v1/watch/{id}, or a request on protocol.WatchStatusSubject): its HTTP
// status and its body, a value encoding/json encodes. 200 with the watch
// and each of its turns and calls, as caller may see them; 403 for a
// watch that calls none of caller's teams' functions; 404 for no such
// watch; 503 while JetStream is unavailable; 500 otherwise.
func (d *Dispatcher) AnswerWatchStatus(ctx context.Context, caller Caller, id string) (status int, reply any) {
	status, reply = d.watchReport(ctx, id)
	if rep, ok := reply.(watchReport); ok {
		status, reply = rep.seenBy(caller)
	}
	return status, reply
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
		calls := make([]CallReport, len(tr.Calls))
		for j, c := range tr.Calls {
			if caller.Sees(c.Team) {
				mine++
				calls[j] = c
				continue
			}
			others++
			calls[j] = CallReport{ID: c.ID, Function: c.Function, Team: c.Team, Result: c.Result, Redacted: true}
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
