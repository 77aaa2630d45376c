package protocol

// HeaderCarrier carries W3C trace context (traceparent, tracestate) in NATS
// message headers. nats.Header is a map[string][]string whose keys are
// case-sensitive; unlike an HTTP header carrier this one keeps keys as
// given, so "traceparent" stays lower-case for clients in other languages.
// It satisfies OpenTelemetry's propagation.TextMapCarrier:
//
//	otel.GetTextMapPropagator().Inject(ctx, protocol.HeaderCarrier(msg.Header))
type HeaderCarrier map[string][]string

// Get returns the first value of key, or "".
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Set replaces the values of key.
func (c HeaderCarrier) Set(key, value string) { c[key] = []string{value} }

// Keys lists the keys present.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}
