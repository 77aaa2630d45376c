package dispatch

import (
	"fmt"
	"strconv"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A turn record is written three times in its life (taken in, submitting,
// submitted), on every turn's critical path: appendTurn writes it by hand,
// as pkg/protocol writes the envelopes (see protocol.AppendJSONString).
// Records are read back with encoding/json; TestRecordEncodingMatchesJSON
// holds the two to the same meaning for every field, so a field added to
// Turn, Ref or TurnCall without a line here fails it.

func appendTurn(b []byte, t *Turn) ([]byte, error) {
	var err error
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(t.Version), 10)
	b = protocol.AppendJSONField(b, "key", string(t.Key))
	b = append(b, `,"ref":`...)
	b = appendRef(b, &t.Ref)
	b = protocol.AppendJSONField(b, "scope", t.Scope)
	b = protocol.AppendJSONOptional(b, "turn_id", t.TurnID)
	b = protocol.AppendJSONField(b, "state", string(t.recordState()))
	b = append(b, `,"calls":`...)
	if t.Calls == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '[')
		for i := range t.Calls {
			if i > 0 {
				b = append(b, ',')
			}
			if b, err = appendCall(b, &t.Calls[i]); err != nil {
				return nil, err
			}
		}
		b = append(b, ']')
	}
	for _, f := range [...]struct {
		name string
		at   time.Time
	}{{"created_at", t.CreatedAt}, {"expires_at", t.ExpiresAt}, {"deadline", t.Deadline}} {
		if b, err = protocol.AppendJSONTime(b, f.name, f.at); err != nil {
			return nil, err
		}
	}
	if o := t.out; o != nil {
		b = protocol.AppendJSONOptional(b, "owner", o.Owner)
		for _, f := range [...]struct {
			name string
			at   time.Time
		}{{"submitting_since", t.recordSubmittingSince()}, {"submitted_at", o.SubmittedAt}} {
			if f.at.IsZero() {
				continue // omitzero
			}
			if b, err = protocol.AppendJSONTime(b, f.name, f.at); err != nil {
				return nil, err
			}
		}
		if o.CutOff {
			b = append(b, `,"cut_off":true`...)
		}
		if len(o.TimedOut) > 0 {
			b = append(b, `,"timed_out":[`...)
			for i, k := range o.TimedOut {
				if i > 0 {
					b = append(b, ',')
				}
				b = protocol.AppendJSONString(b, string(k))
			}
			b = append(b, ']')
		}
		b = protocol.AppendJSONOptional(b, "error", o.Error)
		if o.Next != nil {
			b = append(b, `,"next":`...)
			b = appendRef(b, o.Next)
		}
		if o.Held {
			b = append(b, `,"held":true`...)
		}
		b = protocol.AppendJSONOptional(b, "holder", o.Holder)
	}
	if !t.Trace.IsZero() {
		b = append(b, `,"trace":{`...)
		sep := false
		for _, f := range [...]struct{ name, value string }{{"baggage", t.Trace.Baggage}, {"traceparent", t.Trace.Traceparent}, {"tracestate", t.Trace.Tracestate}} {
			if f.value == "" {
				continue
			}
			if sep {
				b = append(b, ',')
			}
			sep = true
			b = append(protocol.AppendJSONString(b, f.name), ':')
			b = protocol.AppendJSONString(b, f.value)
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

func appendRef(b []byte, r *Ref) []byte {
	b = append(b, `{"platform":`...)
	b = protocol.AppendJSONString(b, string(r.Platform))
	b = protocol.AppendJSONOptional(b, "session_id", r.SessionID)
	b = protocol.AppendJSONOptional(b, "thread_id", r.ThreadID)
	b = protocol.AppendJSONOptional(b, "run_id", r.RunID)
	b = protocol.AppendJSONOptional(b, "response_id", r.ResponseID)
	b = protocol.AppendJSONOptional(b, "conversation", r.Conversation)
	b = protocol.AppendJSONOptional(b, "model", r.Model)
	if r.Agent != nil {
		b = append(b, `,"agent":{"name":`...)
		b = protocol.AppendJSONString(b, r.Agent.Name)
		b = protocol.AppendJSONOptional(b, "version", r.Agent.Version)
		b = append(b, '}')
	}
	if r.Background {
		b = append(b, `,"background":true`...)
	}
	return append(b, '}')
}

func appendCall(b []byte, c *TurnCall) ([]byte, error) {
	b = append(b, `{"id":`...)
	b = protocol.AppendJSONString(b, c.ID)
	b = protocol.AppendJSONField(b, "name", c.Name)
	b = protocol.AppendJSONField(b, "key", string(c.Key))
	b = protocol.AppendJSONField(b, "team", c.Team)
	b, err := protocol.AppendJSONRaw(append(b, `,"arguments":`...), c.Arguments)
	if err != nil { // intake keeps nothing but JSON
		return nil, fmt.Errorf("the arguments of call %q are not JSON: %w", c.ID, err)
	}
	if c.Rejected {
		b = append(b, `,"rejected":true`...)
	}
	return append(b, '}'), nil
}
