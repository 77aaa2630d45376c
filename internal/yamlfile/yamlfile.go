// Package yamlfile decodes the YAML files teams write by hand — functions
// files and scenarios files — strictly, so that a mistyped key is an error
// rather than a setting silently ignored.
package yamlfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// Decode reads the YAML (or JSON) file at path into v, refusing keys v
// has no field for. An empty file is an error saying it needs the
// top-level list named list. Errors start with the path; YAML's own name
// the line and the key.
func Decode(path string, v any, list string) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return fmt.Errorf("%s: the file is empty; it needs a %s: list", path, list)
		}
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
