package dispatch

import (
	"context"
	"testing"
	"time"
)

func TestLimiterKeepsABurstFromStarvingOtherTeams(t *testing.T) {
	l := newLimiter(4, 2)
	ctx := context.Background()
	// Team "bulk" holds its two slots and queues more.
	var held []func()
	for range 2 {
		release, err := l.acquire(ctx, "bulk")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, release)
	}
	blocked := make(chan struct{})
	go func() {
		release, err := l.acquire(ctx, "bulk")
		if err == nil {
			release()
		}
		close(blocked)
	}()
	// Another team still gets through at once: the burst cannot take the
	// global slots beyond its share.
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	release, err := l.acquire(quick, "small")
	if err != nil {
		t.Fatalf("team small starved: %v", err)
	}
	release()
	select {
	case <-blocked:
		t.Fatal("team bulk got a third slot while holding its two")
	default:
	}
	for _, r := range held {
		r()
	}
	<-blocked
}

func TestLimiterRespectsCancellation(t *testing.T) {
	l := newLimiter(1, 1)
	release, _ := l.acquire(context.Background(), "a")
	defer release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.acquire(ctx, "a"); err == nil {
		t.Fatal("acquired a slot with a cancelled context")
	}
}
