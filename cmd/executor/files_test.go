package main

import (
	"testing"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// writeFile writes a functions file into a temporary directory.
func writeFile(t *testing.T, body string) string {
	t.Helper()
	return testutil.WriteFile(t, "functions.yaml", body)
}
