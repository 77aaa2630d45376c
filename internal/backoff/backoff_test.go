package backoff

import (
	"context"
	"testing"
	"time"
)

func within(t *testing.T, got, want time.Duration) {
	t.Helper()
	if got > want || got < want*3/4 {
		t.Errorf("delay %s, want %s less at most a quarter", got, want)
	}
}

func TestNextGrowsToMaxAndResets(t *testing.T) {
	b := Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	for _, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		within(t, b.Next(), want*time.Millisecond)
	}
	b.Reset()
	within(t, b.Next(), 100*time.Millisecond)

	slow := Backoff{Initial: 200 * time.Millisecond, Max: 5 * time.Second, Factor: 1.5}
	for _, want := range []time.Duration{200, 300, 450} {
		within(t, slow.Next(), want*time.Millisecond)
	}
}

func TestDelayByTries(t *testing.T) {
	b := Backoff{Initial: 200 * time.Millisecond, Max: 10 * time.Second}
	for n, want := range map[int]time.Duration{1: 200, 2: 400, 3: 800, 7: 10000, 100: 10000} {
		within(t, b.Delay(n), want*time.Millisecond)
	}
}

func TestSleepEndsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep waited out an hour on a cancelled context")
	}
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep did not report a full wait")
	}
}
