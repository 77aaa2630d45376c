// Package testutil holds what the tests of every package share.
//
// It imports only the standard library; only tests import it.
package testutil

import (
	"testing"
	"time"
)

// WaitForWhat polls cond every 10ms until it holds, failing the test with
// what it waited for (what completes "waited 10s for ...") if it does not
// within the given time. Tests wait on conditions, never on fixed sleeps.
func WaitForWhat(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
