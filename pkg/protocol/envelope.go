package protocol

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unicode/utf8"
)

// Version is the envelope version this package writes. Decoders accept
// envelopes up to this version and ignore fields they do not know.
const Version = 1

// Header names set on call and result messages, besides Nats-Msg-Id and the
// W3C trace context (traceparent, tracestate).
const (
	HeaderCallKey  = "Toolrelay-Call-Key"
	HeaderDeadline = "Toolrelay-Deadline"
	HeaderFunction = "Toolrelay-Function"
	// HeaderSchema, on a call, is the digest of the parameter schema the
	// dispatcher checked its arguments against. An executor whose own
	// schema has that digest does not check them again; any other does.
	HeaderSchema = "Toolrelay-Schema"
)

// MaxEnvelopeSize bounds an encoded envelope: NATS' default max_payload.
const MaxEnvelopeSize = 1 << 20

// MaxOutputSize bounds the output a result carries, leaving room for the rest
// of the envelope within MaxEnvelopeSize even after JSON escaping.
const MaxOutputSize = 256 << 10

// MaxArgumentsSize bounds the arguments of one call: the dispatcher fails a
// call with larger arguments at intake (invalid_arguments), so a call
// envelope always fits within MaxEnvelopeSize.
const MaxArgumentsSize = 256 << 10

// Call is what the dispatcher publishes for an executor to run.
type Call struct {
	Version  int      `json:"v"`
	Key      CallKey  `json:"key"`
	Platform Platform `json:"platform"`
	// Scope is the platform object the call belongs to: a session, a
	// thread/run pair or a response, for people reading traces and logs.
	Scope string `json:"scope"`
	// CallID is the platform's ID of the call.
	CallID    string          `json:"call_id"`
	Team      string          `json:"team"`
	Function  string          `json:"function"`
	Arguments json.RawMessage `json:"arguments"`
	// Format is FormatText for a call of a custom tool (a function
	// declared with a Format): Arguments is then a JSON string holding
	// the model's raw input (see Input). Empty: JSON arguments.
	Format string `json:"format,omitempty"`
	// Deadline is when the dispatcher submits the turn with or without this
	// call's result. Handlers run under it.
	Deadline  time.Time `json:"deadline"`
	CreatedAt time.Time `json:"created_at"`
	// KeepResultUntil is how long the dispatcher may read the call's
	// result: its writer keeps it that long and no longer (see
	// [Call.ResultTTL]). Zero: the result stream's MaxAge alone bounds it.
	KeepResultUntil time.Time `json:"keep_result_until,omitzero"`
}

// ResultTTL is the Nats-TTL a result of c carries when recorded at now:
// until KeepResultUntil, at least ResultMinTTL (a result recorded after
// every reader is done still answers a redelivery's recorded-result
// check) and at most ResultMaxAge, rounded up to a whole second, which is
// what the server counts in. Zero when c names no KeepResultUntil: the
// result is then kept for the stream's MaxAge.
func (c *Call) ResultTTL(now time.Time) time.Duration {
	if c.KeepResultUntil.IsZero() {
		return 0
	}
	ttl := min(max(c.KeepResultUntil.Sub(now), ResultMinTTL), ResultMaxAge)
	return (ttl + time.Second - 1).Truncate(time.Second)
}

// Validate reports whether c is complete and consistent.
func (c *Call) Validate() error {
	switch {
	case c.Version < 1 || c.Version > Version:
		return fmt.Errorf("%w: call version %d not supported (want 1..%d)", ErrMalformed, c.Version, Version)
	case c.CallID == "":
		return fmt.Errorf("%w: call %s has no call_id", ErrMalformed, c.Key)
	case c.Deadline.IsZero():
		return fmt.Errorf("%w: call %s has no deadline", ErrMalformed, c.Key)
	case !json.Valid(c.Arguments):
		return fmt.Errorf("%w: call %s: arguments are not valid JSON", ErrMalformed, c.Key)
	case c.Format != "" && c.Format != FormatText:
		return fmt.Errorf("%w: call %s: format %q: want %q or none", ErrMalformed, c.Key, c.Format, FormatText)
	case c.Format == FormatText && (len(c.Arguments) == 0 || c.Arguments[0] != '"'):
		return fmt.Errorf("%w: call %s: a text call's arguments must be a JSON string", ErrMalformed, c.Key)
	}
	if err := c.Key.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := c.Platform.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := ValidateTeamName(c.Team); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := ValidateFunctionName(c.Function); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// Input returns the raw text of a custom tool call (Format FormatText),
// and false for a call with JSON arguments.
func (c *Call) Input() (string, bool) {
	if c.Format != FormatText {
		return "", false
	}
	var s string
	if json.Unmarshal(c.Arguments, &s) != nil {
		return "", false
	}
	return s, true
}

// Subject returns the subject the call is published to.
func (c *Call) Subject() string { return CallSubject(c.Team, c.Function) }

// ResultSubject returns the subject the call's result is recorded on.
func (c *Call) ResultSubject() string { return ResultSubject(c.Team, c.Key) }

// EncodeCall validates and encodes c.
func EncodeCall(c *Call) ([]byte, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	b, err := appendCall(make([]byte, 0, envelopeRoom+len(c.Arguments)+len(c.Scope)), c)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode call %s: %w", c.Key, err)
	}
	if len(b) > MaxEnvelopeSize {
		return nil, fmt.Errorf("%w: call %s is %d bytes, more than %d", ErrMalformed, c.Key, len(b), MaxEnvelopeSize)
	}
	return b, nil
}

// DecodeCall decodes and validates a call envelope.
func DecodeCall(data []byte) (*Call, error) {
	var c Call
	if err := decodeEnvelope(data, &c, readCall); err != nil {
		return nil, fmt.Errorf("%w: call: %w", ErrMalformed, err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Result is the outcome of a call, recorded once per call.
type Result struct {
	Version  int     `json:"v"`
	Key      CallKey `json:"key"`
	CallID   string  `json:"call_id"`
	Team     string  `json:"team"`
	Function string  `json:"function"`
	// Output is what the function returned; empty when Error is set.
	Output string `json:"output,omitempty"`
	// Error is set when the call failed.
	Error *CallError `json:"error,omitempty"`
	// Executor names the process that produced the result.
	Executor   string    `json:"executor,omitempty"`
	Attempt    int       `json:"attempt,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at"`
}

// OK reports whether the call succeeded.
func (r *Result) OK() bool { return r.Error == nil }

// Validate reports whether r is complete and consistent.
func (r *Result) Validate() error {
	switch {
	case r.Version < 1 || r.Version > Version:
		return fmt.Errorf("%w: result version %d not supported (want 1..%d)", ErrMalformed, r.Version, Version)
	case r.CallID == "":
		return fmt.Errorf("%w: result %s has no call_id", ErrMalformed, r.Key)
	case !utf8.ValidString(r.Output):
		return fmt.Errorf("%w: result %s: output is not valid UTF-8", ErrMalformed, r.Key)
	case len(r.Output) > MaxOutputSize:
		return fmt.Errorf("%w: result %s: output is %d bytes, more than %d", ErrMalformed, r.Key, len(r.Output), MaxOutputSize)
	case r.FinishedAt.IsZero():
		return fmt.Errorf("%w: result %s has no finished_at", ErrMalformed, r.Key)
	}
	if r.Error != nil {
		if err := r.Error.Code.Validate(); err != nil {
			return fmt.Errorf("%w: result %s: %w", ErrMalformed, r.Key, err)
		}
		if r.Error.Message == "" || !utf8.ValidString(r.Error.Message) {
			return fmt.Errorf("%w: result %s: error message must be non-empty UTF-8", ErrMalformed, r.Key)
		}
		if r.Output != "" {
			return fmt.Errorf("%w: result %s has both output and error", ErrMalformed, r.Key)
		}
	}
	if err := r.Key.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := validResultTeam(r.Team); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if err := ValidateFunctionName(r.Function); err != nil {
		return fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return nil
}

// Subject returns the subject the result is recorded on.
func (r *Result) Subject() string { return ResultSubject(r.Team, r.Key) }

// EncodeResult validates and encodes r.
func EncodeResult(r *Result) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	b, err := appendResult(make([]byte, 0, envelopeRoom+len(r.Output)+len(r.Executor)), r)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode result %s: %w", r.Key, err)
	}
	return b, nil
}

// envelopeRoom is what an envelope takes besides its variable parts, as
// a first guess at its size.
const envelopeRoom = 320

func appendCall(b []byte, c *Call) ([]byte, error) {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(c.Version), 10)
	b = AppendJSONField(b, "key", string(c.Key))
	b = AppendJSONField(b, "platform", string(c.Platform))
	b = AppendJSONField(b, "scope", c.Scope)
	b = AppendJSONField(b, "call_id", c.CallID)
	b = AppendJSONField(b, "team", c.Team)
	b = AppendJSONField(b, "function", c.Function)
	b, err := AppendJSONRaw(append(b, `,"arguments":`...), c.Arguments)
	if err != nil {
		return nil, err
	}
	b = AppendJSONOptional(b, "format", c.Format)
	if b, err = AppendJSONTime(b, "deadline", c.Deadline); err != nil {
		return nil, err
	}
	if b, err = AppendJSONTime(b, "created_at", c.CreatedAt); err != nil {
		return nil, err
	}
	if !c.KeepResultUntil.IsZero() {
		if b, err = AppendJSONTime(b, "keep_result_until", c.KeepResultUntil); err != nil {
			return nil, err
		}
	}
	return append(b, '}'), nil
}

func appendResult(b []byte, r *Result) ([]byte, error) {
	b = append(b, `{"v":`...)
	b = strconv.AppendInt(b, int64(r.Version), 10)
	b = AppendJSONField(b, "key", string(r.Key))
	b = AppendJSONField(b, "call_id", r.CallID)
	b = AppendJSONField(b, "team", r.Team)
	b = AppendJSONField(b, "function", r.Function)
	b = AppendJSONOptional(b, "output", r.Output)
	if r.Error != nil {
		b = append(b, `,"error":{"type":`...)
		b = AppendJSONString(b, string(r.Error.Code))
		b = AppendJSONField(b, "message", r.Error.Message)
		b = append(b, '}')
	}
	b = AppendJSONOptional(b, "executor", r.Executor)
	if r.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(r.Attempt), 10)
	}
	var err error
	if !r.StartedAt.IsZero() {
		if b, err = AppendJSONTime(b, "started_at", r.StartedAt); err != nil {
			return nil, err
		}
	}
	if b, err = AppendJSONTime(b, "finished_at", r.FinishedAt); err != nil {
		return nil, err
	}
	return append(b, '}'), nil
}

// DecodeResult decodes and validates a result envelope.
func DecodeResult(data []byte) (*Result, error) {
	var r Result
	if err := decodeEnvelope(data, &r, readResult); err != nil {
		return nil, fmt.Errorf("%w: result: %w", ErrMalformed, err)
	}
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return &r, nil
}

// NewFailure returns a failed result for call c.
func NewFailure(c *Call, code ErrorCode, message string, at time.Time) *Result {
	return &Result{
		Version:    Version,
		Key:        c.Key,
		CallID:     c.CallID,
		Team:       c.Team,
		Function:   c.Function,
		Error:      &CallError{Code: code, Message: message},
		FinishedAt: at,
	}
}

// ModelOutput is the output string submitted to platforms without a failure
// flag (Assistants, Responses): the output itself, or for a failure the JSON
// {"error":{"type":"...","message":"..."}}.
func (r *Result) ModelOutput() string {
	if r.Error == nil {
		return r.Output
	}
	b, _ := json.Marshal(struct {
		Error *CallError `json:"error"`
	}{r.Error})
	return string(b)
}

func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("protocol: encode: %w", err)
	}
	return b, nil
}

// decodeEnvelope decodes a call or result envelope into v: on the fast
// path when it takes data (see jsonread.go), otherwise by encoding/json
// into a fresh v.
func decodeEnvelope[T any](data []byte, v *T, fast func([]byte, *T) bool) error {
	if len(data) > MaxEnvelopeSize {
		return fmt.Errorf("%d bytes, more than %d", len(data), MaxEnvelopeSize)
	}
	if fast(data, v) {
		return nil
	}
	var zero T
	*v = zero // what the fast path filled before it gave up
	return json.Unmarshal(data, v)
}

// decodeStrictJSON decodes one JSON value with a size check; json.Unmarshal
// refuses trailing data. Unknown fields are allowed so that newer minor
// versions stay readable.
func decodeStrictJSON(data []byte, v any) error {
	if len(data) > MaxEnvelopeSize {
		return fmt.Errorf("%d bytes, more than %d", len(data), MaxEnvelopeSize)
	}
	return json.Unmarshal(data, v)
}
