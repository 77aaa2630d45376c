package dispatch

import "strings"

// TraceContext is a W3C trace context as a turn or watch record stores
// it: the fields of the propagation the wire contract fixes (traceparent,
// tracestate, baggage). Its JSON form is the object a map of those
// headers would encode to; held in memory it costs the strings alone,
// where a map cost a few hundred bytes a turn.
type TraceContext struct {
	Baggage     string `json:"baggage,omitempty"`
	Traceparent string `json:"traceparent,omitempty"`
	Tracestate  string `json:"tracestate,omitempty"`
}

// Get, Set and Keys make a *TraceContext a propagation.TextMapCarrier.
// Keys other than the three fields are not kept: no propagator the
// dispatcher runs writes them.
func (c *TraceContext) Get(key string) string {
	switch strings.ToLower(key) {
	case "baggage":
		return c.Baggage
	case "traceparent":
		return c.Traceparent
	case "tracestate":
		return c.Tracestate
	}
	return ""
}

func (c *TraceContext) Set(key, value string) {
	switch strings.ToLower(key) {
	case "baggage":
		c.Baggage = value
	case "traceparent":
		c.Traceparent = value
	case "tracestate":
		c.Tracestate = value
	}
}

func (c *TraceContext) Keys() []string {
	var keys []string
	for _, kv := range [...]struct{ k, v string }{{"baggage", c.Baggage}, {"traceparent", c.Traceparent}, {"tracestate", c.Tracestate}} {
		if kv.v != "" {
			keys = append(keys, kv.k)
		}
	}
	return keys
}

// IsZero reports whether c holds no context.
func (c TraceContext) IsZero() bool { return c == TraceContext{} }

// TraceID is the trace ID c's traceparent names, or "".
func (c TraceContext) TraceID() string {
	parts := strings.Split(c.Traceparent, "-")
	if len(parts) == 4 && len(parts[1]) == 32 {
		return parts[1]
	}
	return ""
}
