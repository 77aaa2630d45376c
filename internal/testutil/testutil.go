// Package testutil holds what the tests of every package share.
//
// It imports only the standard library; only tests import it.
package testutil

import (
	"testing"
	"time"
)

// WaitFor polls cond every 10ms until it holds, failing the test if it does
// not within the given time. Tests wait on conditions, never on fixed sleeps.
func WaitFor(t testing.TB, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Await is WaitFor that names what it waited for when it fails: "the call
// was served again" reads better in a failure than a line number.
func Await(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited %s for %s; it did not happen", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
