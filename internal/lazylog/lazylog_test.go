package lazylog

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

// What a wrapped logger writes is what the handler beneath writes, for
// every mix of attributes and groups, at every depth.
func TestAWrappedLoggerWritesWhatItsHandlerWrites(t *testing.T) {
	var want, got bytes.Buffer
	opts := &slog.HandlerOptions{Level: slog.LevelInfo}
	log := func(l *slog.Logger) {
		l = l.With("team", "geo", "executor", "e1")
		l.Info("plain", "n", 1)
		c := l.With("call_key", "k.1", "attempt", 2)
		c.Debug("below the level")
		c.Warn("with call", "err", "boom")
		g := c.WithGroup("req").With("id", "r1")
		g.Error("grouped", "size", 3)
		c.Info("back outside the group")
	}
	log(slog.New(slog.NewJSONHandler(&want, opts)))
	log(slog.New(Wrap(slog.NewJSONHandler(&got, opts))))
	strip := func(s string) string { // the times differ
		var out []string
		for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
			out = append(out, line[strings.Index(line, `"level"`):])
		}
		return strings.Join(out, "\n")
	}
	if strip(got.String()) != strip(want.String()) {
		t.Fatalf("wrapped wrote\n%s\nwant\n%s", got.String(), want.String())
	}
	if strings.Contains(got.String(), "below the level") {
		t.Fatal("a record below the level was written")
	}
}

// With costs no formatting: the handler beneath is asked for its
// attributes only once a record is handled.
func TestWithFormatsNothingUntilARecordIsHandled(t *testing.T) {
	base := &countingHandler{Handler: slog.NewTextHandler(&bytes.Buffer{}, nil)}
	l := slog.New(Wrap(base))
	for range 100 {
		l.With("call_key", "k").Debug("not written")
	}
	if base.withs != 0 {
		t.Fatalf("the handler beneath formatted attributes %d times with nothing written", base.withs)
	}
	l.With("call_key", "k").Info("written")
	if base.withs != 1 {
		t.Fatalf("formatted %d times for one record, want 1", base.withs)
	}
}

type countingHandler struct {
	slog.Handler
	withs int
}

func (c *countingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c.withs++
	return c.Handler.WithAttrs(as)
}
