package schema

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolrelay/toolrelay/internal/schema/schematest"
)

var benchArgs = []byte(`{"city":"Paris","units":"metric","days":3,"include":["wind","rain"]}`)

func BenchmarkDecode(b *testing.B) {
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := decode(benchArgs); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := jsonschema.UnmarshalJSON(bytes.NewReader(benchArgs)); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkCheckAtMaxSteps checks arguments that fail every path of the
// longest anyOf/$ref chain MaxSteps admits: the most one call costs.
func BenchmarkCheckAtMaxSteps(b *testing.B) {
	for n := 19; ; n-- {
		s, err := Compile("f", schematest.RefChain(n))
		if err != nil {
			continue
		}
		b.Logf("longest chain admitted: %d", n)
		b.ReportAllocs()
		for b.Loop() {
			if s.Check(schematest.RefChainArgs) == "" {
				b.Fatal("arguments passed")
			}
		}
		return
	}
}
