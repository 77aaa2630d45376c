package testutil

import (
	"os"
	"path/filepath"
	"testing"
)

// WriteFile writes body to a file called name in a new temporary
// directory of the test and returns its path.
func WriteFile(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
