package attrcache

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// Measurements recorded through the cache land on the same series as ones
// recorded with the attributes directly, in any order of the attributes.
func TestCachedSetsRecordTheSameSeries(t *testing.T) {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	calls, err := mp.Meter("test").Int64Counter("calls")
	if err != nil {
		t.Fatal(err)
	}
	var c Cache
	ctx := context.Background()
	fn, team := attribute.String("function", "get_weather"), attribute.String("team", "geo")
	for range 3 {
		calls.Add(ctx, 1, c.Add(fn, team)...)
	}
	calls.Add(ctx, 1, c.Add(team, fn)...)
	calls.Add(ctx, 1, c.Add(attribute.String("function", "other"), team)...)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, dp := range rm.ScopeMetrics[0].Metrics[0].Data.(metricdata.Sum[int64]).DataPoints {
		v, _ := dp.Attributes.Value("function")
		got[v.AsString()] = dp.Value
	}
	if got["get_weather"] != 4 || got["other"] != 1 || len(got) != 2 {
		t.Fatalf("series = %v, want get_weather:4 other:1", got)
	}
}

func TestCacheIsBounded(t *testing.T) {
	var c Cache
	for i := range maxEntries + 10 {
		c.Add(attribute.Int("i", i))
	}
	if len(c.m) != maxEntries {
		t.Fatalf("cache holds %d sets, want at most %d", len(c.m), maxEntries)
	}
}

// Instruments behind interfaces the compiler cannot see through, as the
// hot paths hold them.
var (
	noopCalls, _ = noop.NewMeterProvider().Meter("test").Int64Counter("calls")
	noopTook, _  = noop.NewMeterProvider().Meter("test").Float64Histogram("took")
)

// A measurement with a cached set allocates nothing for its options: the
// hot paths make a few per call.
func TestMeasuringWithACachedSetAllocatesNothing(t *testing.T) {
	var c Cache
	ctx := context.Background()
	fn, outcome := attribute.String("function", "get_weather"), attribute.String("outcome", "ok")
	measure := func() {
		noopCalls.Add(ctx, 1, c.Add(fn, outcome)...)
		noopTook.Record(ctx, 0.5, c.Record(fn)...)
	}
	measure()
	if n := testing.AllocsPerRun(100, measure); n != 0 {
		t.Fatalf("measuring made %.0f allocations", n)
	}
}
