package testutil

import (
	"bytes"
	"log/slog"
	"sync"
	"testing"
)

// Logger returns a logger whose records are kept in memory and shown (the
// last 8 KiB) only if the test fails, so a failure on a busy CI machine
// can be diagnosed without flooding passing runs.
func Logger(t testing.TB) *slog.Logger {
	l := &Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- log ---\n%s", l.Tail(8<<10))
		}
	})
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// Buffer is a bytes buffer safe for concurrent use: a log destination a
// test reads while the code under test writes to it.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Buffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything written so far.
func (l *Buffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Tail returns the last n bytes written.
func (l *Buffer) Tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buf.Bytes()
	return string(b[max(0, len(b)-n):])
}
