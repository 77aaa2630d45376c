package schema

import (
	"fmt"
	"slices"

	"github.com/toolrelay/toolrelay/internal/suggest"
)

// keywords are the keywords of JSON Schema 2020-12 (core, applicator,
// unevaluated, validation, meta-data, format and content vocabularies),
// and definitions, which earlier drafts use for $defs.
var keywords = []string{
	"$schema", "$id", "$ref", "$anchor", "$dynamicRef", "$dynamicAnchor", "$vocabulary", "$comment", "$defs",
	"prefixItems", "items", "contains", "additionalProperties", "properties", "patternProperties",
	"dependentSchemas", "propertyNames", "if", "then", "else", "allOf", "anyOf", "oneOf", "not",
	"unevaluatedItems", "unevaluatedProperties",
	"type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
	"maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxContains", "minContains",
	"maxProperties", "minProperties", "required", "dependentRequired",
	"title", "description", "default", "deprecated", "readOnly", "writeOnly", "examples",
	"format", "contentEncoding", "contentMediaType", "contentSchema",
	"definitions",
}

// otherKeys are keys of earlier drafts and of OpenAPI that schemas in use
// carry: never suggested, never refused, though some are near a keyword
// ("example" is one letter from "examples").
var otherKeys = []string{"id", "dependencies", "additionalItems", "$recursiveRef", "$recursiveAnchor",
	"example", "nullable", "discriminator", "xml", "externalDocs"}

// maxTypoDistance is how far (in edits) from a keyword a key may be and
// still be taken for its misspelling.
const maxTypoDistance = 2

// Misspelling is a key at a schema position that is not a keyword but is
// near one. JSON Schema ignores unknown keys, so a misspelt "requird"
// would leave every argument optional.
type Misspelling struct {
	Pointer string // JSON Pointer to the key: "/properties/id/requird"
	Key     string // as written: "requird"
	Keyword string // the keyword it is near: "required"
}

func (m Misspelling) String() string {
	return fmt.Sprintf("unknown keyword %q at %s (did you mean %q?)", m.Key, m.Pointer, m.Keyword)
}

// Misspellings walks the schema doc (as encoding/json decodes it) and
// returns its keys that are at most maxTypoDistance edits from a keyword
// without being one, ordered by key at each level of the schema. Names
// under properties, patternProperties, $defs, definitions and
// dependentSchemas are property names, not keys; const, enum, default and
// examples hold data, not schemas.
func Misspellings(doc any) []Misspelling {
	var out []Misspelling
	var walk func(v any, at string)
	walkEach := func(v any, at string) {
		switch v := v.(type) {
		case []any:
			for i, s := range v {
				walk(s, fmt.Sprintf("%s/%d", at, i))
			}
		case map[string]any:
			for _, name := range sortedKeys(v) {
				walk(v[name], at+"/"+escapePointer(name))
			}
		}
	}
	walk = func(v any, at string) {
		m, ok := v.(map[string]any)
		if !ok {
			return // true and false are schemas too, with no keys
		}
		for _, k := range sortedKeys(m) {
			here := at + "/" + escapePointer(k)
			switch k {
			case "properties", "patternProperties", "$defs", "definitions", "dependentSchemas", "dependencies":
				if names, ok := m[k].(map[string]any); ok {
					walkEach(names, here)
				}
			case "items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
				"unevaluatedItems", "unevaluatedProperties", "additionalItems", "contentSchema":
				walk(m[k], here)
				if k == "items" { // draft 7's tuple form: an array of schemas
					if _, ok := m[k].([]any); ok {
						walkEach(m[k], here)
					}
				}
			case "allOf", "anyOf", "oneOf", "prefixItems":
				walkEach(m[k], here)
			default:
				if slices.Contains(keywords, k) || slices.Contains(otherKeys, k) {
					continue
				}
				if near := suggest.Closest(k, keywords); near != "" && suggest.Distance(k, near) <= maxTypoDistance {
					out = append(out, Misspelling{Pointer: here, Key: k, Keyword: near})
				}
			}
		}
	}
	walk(doc, "")
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// escapePointer escapes a key as a JSON Pointer token (RFC 6901).
func escapePointer(k string) string {
	return pointerEscaper.Replace(k)
}
