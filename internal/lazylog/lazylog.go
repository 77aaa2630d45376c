// Package lazylog defers the work of slog's Logger.With until a record is
// logged.
//
// The dispatcher and executors give each message a logger carrying its
// keys (the call, the attempt, the subject), and nearly every message is
// handled without logging anything. slog's text and JSON handlers format
// the attributes of With at once, so each message paid for formatting that
// was almost never written: in the bench, about a seventh of the CPU of a
// single-call turn. A Handler from Wrap keeps them as they are and has the
// handler beneath format them only when a record is handled.
//
// It imports only the standard library.
package lazylog

import (
	"context"
	"log/slog"
	"sync"
)

// Wrap returns h with WithAttrs and WithGroup deferred.
func Wrap(h slog.Handler) slog.Handler {
	if l, ok := h.(*handler); ok {
		return l
	}
	return &handler{base: h}
}

// handler is base with ops applied when first needed.
type handler struct {
	base slog.Handler
	ops  []op

	once  sync.Once
	built slog.Handler
}

// op is one WithAttrs (attrs) or WithGroup (group) call.
type op struct {
	attrs []slog.Attr
	group string
}

func (h *handler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.base.Enabled(ctx, level)
}

func (h *handler) Handle(ctx context.Context, r slog.Record) error {
	return h.handler().Handle(ctx, r)
}

// handler is base with every op applied, built once.
func (h *handler) handler() slog.Handler {
	h.once.Do(func() {
		b := h.base
		for _, o := range h.ops {
			if o.group != "" {
				b = b.WithGroup(o.group)
			} else {
				b = b.WithAttrs(o.attrs)
			}
		}
		h.built = b
	})
	return h.built
}

func (h *handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return h.with(op{attrs: attrs})
}

func (h *handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return h.with(op{group: name})
}

func (h *handler) with(o op) *handler {
	ops := make([]op, len(h.ops), len(h.ops)+1)
	copy(ops, h.ops)
	return &handler{base: h.base, ops: append(ops, o)}
}
