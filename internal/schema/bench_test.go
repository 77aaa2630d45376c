package schema

import (
	"bytes"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
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
