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
	l := &lockedBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- log ---\n%s", l.tail(8<<10))
		}
	})
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *lockedBuffer) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buf.Bytes()
	return string(b[max(0, len(b)-n):])
}
