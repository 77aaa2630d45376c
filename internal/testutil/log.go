package testutil

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Logger returns a logger whose records are kept in memory and shown (the
// last 8 KiB) only if the test fails, so a failure on a busy CI machine
// can be diagnosed without flooding passing runs.
func Logger(t testing.TB) *slog.Logger { return LoggerTo(t, &Buffer{}) }

// LoggerTo is Logger writing to l, which the test may read.
func LoggerTo(t testing.TB, l *Buffer) *slog.Logger {
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

// Logged reports whether a record at level (such as "ERROR") whose line
// contains text was written.
func (l *Buffer) Logged(level, text string) bool {
	for line := range strings.Lines(l.String()) {
		if strings.Contains(line, "level="+level+" ") && strings.Contains(line, text) {
			return true
		}
	}
	return false
}
