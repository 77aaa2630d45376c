// Package attrcache keeps the attribute sets of metric measurements.
// OpenTelemetry sorts and hashes the attributes of every measurement; the
// hot paths record a few per call with attributes drawn from a small set
// (function, team, outcome), so building each set once saves that work.
//
// It may import only OpenTelemetry's API; pkg/dispatch and pkg/exec use it.
package attrcache

import (
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MaxAttributes is how many attributes a cached set may have.
const MaxAttributes = 3

// maxEntries bounds the cache: past it, sets are built every time (the
// attribute values come from messages, so their number is not ours to fix).
const maxEntries = 4096

// Cache maps attributes to a measurement option. The zero value is ready.
type Cache struct {
	mu sync.RWMutex
	m  map[[MaxAttributes]attribute.KeyValue]metric.MeasurementOption
}

// Get returns metric.WithAttributeSet of kvs (at most MaxAttributes).
func (c *Cache) Get(kvs ...attribute.KeyValue) metric.MeasurementOption {
	if len(kvs) > MaxAttributes {
		return metric.WithAttributes(kvs...)
	}
	var key [MaxAttributes]attribute.KeyValue
	copy(key[:], kvs)
	c.mu.RLock()
	opt, ok := c.m[key]
	c.mu.RUnlock()
	if ok {
		return opt
	}
	opt = metric.WithAttributeSet(attribute.NewSet(kvs...))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[[MaxAttributes]attribute.KeyValue]metric.MeasurementOption{}
	}
	if len(c.m) < maxEntries {
		c.m[key] = opt
	}
	return opt
}
