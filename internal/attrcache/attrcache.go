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

// Cache maps attributes to the options of measurements with them. The zero value is ready.
type Cache struct {
	mu sync.RWMutex
	m  map[[MaxAttributes]attribute.KeyValue]*entry
}

// entry is one set, as the options each kind of instrument takes. A
// measurement's options are variadic and go through an interface, so a
// slice made at the call escapes: handing out one made here saves that
// allocation on every measurement. Instruments only read their options.
type entry struct {
	add []metric.AddOption
	rec []metric.RecordOption
}

// Add returns the options of a counter's Add with the attributes kvs.
func (c *Cache) Add(kvs ...attribute.KeyValue) []metric.AddOption { return c.entry(kvs).add }

// Record returns the options of a histogram's Record with the attributes
// kvs.
func (c *Cache) Record(kvs ...attribute.KeyValue) []metric.RecordOption { return c.entry(kvs).rec }

func (c *Cache) entry(kvs []attribute.KeyValue) *entry {
	if len(kvs) > MaxAttributes {
		return newEntry(kvs)
	}
	var key [MaxAttributes]attribute.KeyValue
	copy(key[:], kvs)
	c.mu.RLock()
	e, ok := c.m[key]
	c.mu.RUnlock()
	if ok {
		return e
	}
	e = newEntry(kvs)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[[MaxAttributes]attribute.KeyValue]*entry{}
	}
	if len(c.m) < maxEntries {
		c.m[key] = e
	}
	return e
}

func newEntry(kvs []attribute.KeyValue) *entry {
	opt := metric.WithAttributeSet(attribute.NewSet(kvs...))
	return &entry{add: []metric.AddOption{opt}, rec: []metric.RecordOption{opt}}
}
