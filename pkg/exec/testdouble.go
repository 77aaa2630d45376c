package exec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/toolrelay/toolrelay/pkg/exec/internal/testhook"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func init() { testhook.Run = runDelivery }

// runDelivery handles one delivery of a call the way a worker does —
// the same checks, Reconcile path, handler run, retry decision and
// dead-letter reason — with nothing read from or written to NATS. Package
// exectest reaches it through testhook; middleware in Options is not
// applied (there is no Executor).
func runDelivery(ctx context.Context, r testhook.Request) (testhook.Outcome, error) {
	fn, ok := r.Function.(Function)
	if !ok {
		return testhook.Outcome{}, fmt.Errorf("exec: run %T: not a Function", r.Function)
	}
	if err := fn.validate(); err != nil {
		return testhook.Outcome{}, err
	}
	if err := r.Call.Validate(); err != nil {
		return testhook.Outcome{}, fmt.Errorf("exec: run %s: %w", fn.Name, err)
	}
	if r.MayHaveRun && !fn.SideEffects {
		return testhook.Outcome{}, fmt.Errorf("exec: run %s: only a SideEffects function is reconciled after an attempt that may have run", fn.Name)
	}
	attempt := max(r.Attempt, 1)
	retry := RetryPolicy{}
	if fn.Retry != nil {
		retry = *fn.Retry
	}
	retry = retry.withDefaults()
	now := time.Now()
	if res, reason := fn.precheck(r.Call, "", attempt, retry, now); res != nil {
		return testhook.Outcome{Result: res, DeadLetter: reason}, nil
	}
	log := func() *slog.Logger { return slog.Default().With("fn", fn.Name, "attempt", attempt) }
	if r.MayHaveRun {
		if fn.Reconcile == nil {
			return testhook.Outcome{Result: mayHaveRunFailure(r.Call, now), DeadLetter: protocol.ReasonMayHaveRun}, nil
		}
		o := invoke(ctx, fn.Reconcile, r.Call, attempt, fn.Timeout, 0, nil, "exectest", log)
		if o.cancelled {
			return testhook.Outcome{}, ErrShutdown
		}
		if !errors.Is(o.err, ErrDidNotRun) {
			return testhook.Outcome{Result: o.res, Err: o.err, Refused: o.refused, DeadLetter: o.deadLetterReason()}, nil
		}
	}
	o := invoke(ctx, fn.Handler, r.Call, attempt, fn.Timeout, 0, nil, "exectest", log)
	if o.cancelled {
		return testhook.Outcome{}, ErrShutdown
	}
	out := testhook.Outcome{Result: o.res, Err: o.err, Refused: o.refused}
	if delay, ok := retry.retryIn(o, attempt, r.Call.Deadline); ok {
		out.Retry, out.RetryIn = true, delay
		return out, nil
	}
	out.DeadLetter = o.deadLetterReason()
	return out, nil
}
