package schema

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMisspellings(t *testing.T) {
	for name, tc := range map[string]struct {
		schema string
		want   []Misspelling
	}{
		"top level": {`{"type":"object","requird":["id"],"propertes":{}}`, []Misspelling{
			{"/propertes", "propertes", "properties"}, {"/requird", "requird", "required"}}},
		"in a property": {`{"type":"object","properties":{"id":{"tpye":"string"}}}`, []Misspelling{
			{"/properties/id/tpye", "tpye", "type"}}},
		"property names are not keywords": {`{"type":"object","properties":{"requird":{},"tpye":{}},"$defs":{"itmes":{}},"patternProperties":{"^x":{}}}`, nil},
		"schemas under items and not": {`{"items":{"minimum":1,"maxmum":3},"not":{"constt":1}}`, []Misspelling{
			{"/items/maxmum", "maxmum", "maximum"}, {"/not/constt", "constt", "const"}}},
		"arrays of schemas": {`{"anyOf":[{"type":"string"},{"fromat":"date"}],"prefixItems":[true,{"enumm":[1]}]}`, []Misspelling{
			{"/anyOf/1/fromat", "fromat", "format"}, {"/prefixItems/1/enumm", "enumm", "enum"}}},
		"data is not a schema": {`{"const":{"requird":1},"enum":[{"tpye":1}],"default":{"itmes":1},"examples":[{"propertes":1}]}`, nil},
		"far from any keyword": {`{"type":"object","x-internal":true,"colour":"blue"}`, nil},
		"keys of earlier drafts and OpenAPI": {`{"example":1,"id":"x","nullable":true,"definitions":{"a":{"tpye":"string"}}}`, []Misspelling{
			{"/definitions/a/tpye", "tpye", "type"}}},
		"pointer escapes": {`{"properties":{"a/b":{"requird":[]}}}`, []Misspelling{{"/properties/a~1b/requird", "requird", "required"}}},
	} {
		t.Run(name, func(t *testing.T) {
			var doc any
			if err := json.Unmarshal([]byte(tc.schema), &doc); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, Misspellings(doc)); diff != "" {
				t.Errorf("Misspellings (-want +got):\n%s", diff)
			}
		})
	}
}
