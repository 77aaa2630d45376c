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
	var held []*slot
	for range 2 {
		s, err := l.acquire(ctx, "bulk")
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, s)
	}
	blocked := make(chan struct{})
	go func() {
		s, err := l.acquire(ctx, "bulk")
		if err == nil {
			s.release()
		}
		close(blocked)
	}()
	// Another team still gets through at once: the burst cannot take the
	// global slots beyond its share.
	quick, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s, err := l.acquire(quick, "small")
	if err != nil {
		t.Fatalf("team small starved: %v", err)
	}
	s.release()
	select {
	case <-blocked:
		t.Fatal("team bulk got a third slot while holding its two")
	default:
	}
	for _, r := range held {
		r.release()
	}
	<-blocked
}

func TestLimiterRespectsCancellation(t *testing.T) {
	l := newLimiter(1, 1)
	s, _ := l.acquire(context.Background(), "a")
	defer s.release()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.acquire(ctx, "a"); err == nil {
		t.Fatal("acquired a slot with a cancelled context")
	}
}

// Releasing a slot twice gives back one: a call's publication may end in
// more than one place, and a second release must not free another's slot.
func TestSlotReleasesOnce(t *testing.T) {
	l := newLimiter(2, 2)
	a, _ := l.tryAcquire("a")
	b, ok := l.tryAcquire("a")
	if !ok {
		t.Fatal("second slot refused")
	}
	a.release()
	a.release()
	if _, ok := l.tryAcquire("a"); !ok {
		t.Fatal("a released slot was not free")
	}
	if _, ok := l.tryAcquire("a"); ok {
		t.Fatal("a third slot was free: the second release gave back b's")
	}
	b.release()
}
