package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// closeTurn moves a collecting turn to submitting and, if this replica wins
// the compare-and-set, submits it. With cutOff (the deadline fired) the
// calls without a result are submitted as timed out; the decision is
// written into the record, so a repeated submission after a crash submits
// exactly the same outputs.
func (d *Dispatcher) closeTurn(ctx context.Context, key protocol.TurnKey, cutOff bool) {
	var timedOut []protocol.CallKey
	known, rev := d.gather.known(key)
	if cutOff {
		t, trev, err := d.turns.get(ctx, key)
		if err != nil {
			return
		}
		if t.State != TurnCollecting {
			if !t.Open() && !d.isSubmittingHere(key) {
				d.closedElsewhere(key) // closed here, its span is ended by its close
			}
			return // closed, or being submitted (here, or by a replica the sweep watches)
		}
		if early := time.Until(t.Deadline); early > 0 {
			backoff.Sleep(ctx, early) // the timer fires on the whole second before
			if t, trev, err = d.turns.get(ctx, key); err != nil || t.State != TurnCollecting {
				return
			}
		}
		timedOut = d.withoutResult(ctx, t)
		if known == nil {
			known, rev = t, trev
		}
	}
	if known == nil {
		var err error
		if known, rev, err = d.turns.get(ctx, key); err != nil {
			d.log.Error("closing turn failed", "turn", key, "err", err)
			return
		}
	}
	// A turn another process holds (hold.go) is left to it; this one
	// looks again in a moment: released by its holder, or old enough to
	// be claimed.
	if _, held := d.heldElsewhere(known, time.Now()); held {
		// As this replica last saw it: read it again.
		var err error
		if known, rev, err = d.turns.get(ctx, key); err != nil {
			d.log.Error("closing turn failed", "turn", key, "err", err)
			return
		}
		d.gather.replace(known, rev)
	}
	if holder, held := d.heldElsewhere(known, time.Now()); held {
		if !cutOff {
			for i := range known.Calls {
				if c := &known.Calls[i]; d.gather.local(key, c.Key) != nil {
					d.nudge(holder, c.Key)
				}
			}
		}
		d.closeLater(key, cutOff)
		return
	}
	// Closed under the mark that the turn is submitted in this process:
	// neither a release nor another close of this process comes between
	// the claim (or the look at this process's hold) and the submission.
	// If the mark is taken, a release or a submission of the turn is under
	// way here: it is looked at again in a moment.
	done, ok := d.submittingHere(key)
	if !ok {
		d.closeLater(key, cutOff)
		return
	}
	// The gatherer's copy, as it is now (a release replaces it). With
	// none, the turn was closed or cancelled here, or found closed
	// elsewhere, since the copy above was read, which is then stale (a
	// hold of this process's it shows may be submitted already): the
	// claim reads the record.
	k, r := d.gather.known(key)
	known, rev = k, r
	if k != nil && d.heldHere(k) && !cutOff && time.Since(k.submittingSince()) < d.holdFor() {
		// Held here and young: submitted with no claim.
		t := known.clone()
		t.claimHeld()
		d.submitClaimed(ctx, t, rev, done)
		return
	}
	t, rev, err := d.claimTurn(ctx, key, known, rev, cutOff, timedOut)
	if err != nil || t == nil {
		done()
		return
	}
	d.submitClaimed(ctx, t, rev, done)
}

// closeLater closes the turn key in a moment, when this replica could not
// now: through a re-check of its results, or, for a cut-off (whose timer
// is spent), by cutting it off again.
func (d *Dispatcher) closeLater(key protocol.TurnKey, cutOff bool) {
	if !cutOff {
		d.gather.recheckIn(key, holdPoll)
		return
	}
	d.background(func(ctx context.Context) {
		wctx, stop := d.withRunContext(ctx)
		waited := backoff.Sleep(wctx, holdPoll)
		stop()
		if waited {
			d.closeTurn(ctx, key, true)
		}
	})
}

// claimTurn moves a collecting turn, known at revision rev, to submitting
// by this replica, and returns it with its revision; nil if another closed
// it first (or claims it: a hold of this replica's is claimed as any
// collecting turn). With cutOff, the calls in timedOut are written into
// the claim as timed out.
func (d *Dispatcher) claimTurn(ctx context.Context, key protocol.TurnKey, known *Turn, rev uint64, cutOff bool, timedOut []protocol.CallKey) (*Turn, uint64, error) {
	now := time.Now().UTC()
	t, rev, err := d.turns.transition(ctx, key, TurnCollecting, known, rev, func(t *Turn) {
		t.State = TurnSubmitting
		o := t.writeOutcome()
		*o = TurnOutcome{Owner: d.opts.Name, SubmittingSince: now, CutOff: cutOff, TimedOut: timedOut}
	})
	switch {
	case err != nil:
		d.log.Error("closing turn failed", "turn", key, "err", err)
	case t == nil:
		d.closedElsewhere(key)
	case cutOff:
		d.log.Warn("deadline reached; submitting without every result", "turn", key, "timed_out", len(timedOut))
	}
	return t, rev, err
}

// takeOver claims a turn stuck in submitting (its owner died: it has been
// submitting for stuckAfter) and submits it again.
func (d *Dispatcher) takeOver(ctx context.Context, key protocol.TurnKey) {
	for {
		if d.isSubmittingHere(key) {
			return // not stuck: this process submits it
		}
		t, rev, err := d.turns.get(ctx, key)
		if err != nil || t.State != TurnSubmitting {
			return
		}
		wait := time.Until(t.Outcome().SubmittingSince.Add(stuckAfter))
		if wait > 0 {
			wctx, stop := d.withRunContext(ctx)
			backoff.Sleep(wctx, wait)
			stopping := wctx.Err() != nil
			stop()
			if stopping {
				return
			}
			continue
		}
		// Claimed under the mark, as every close of this process, so
		// that what is claimed here is submitted here: a close holding
		// the mark would leave a claim of this process unsubmitted.
		done, ok := d.submittingHere(key)
		if !ok {
			return // a close of this process has it now; the next sweep looks again
		}
		claim := t.writeOutcome()
		claim.Owner, claim.SubmittingSince = d.opts.Name, time.Now().UTC()
		newRev, err := d.turns.update(ctx, t, rev)
		if err != nil && !errors.Is(err, errConflict) {
			// The claim may be stored with its answer lost: then it is
			// ours, and nobody else submits the turn unless we do.
			if _, haveRev, found, _ := d.findClaim(ctx, key, rev, claim.Owner, []time.Time{claim.SubmittingSince}); found {
				newRev, err = haveRev, nil
			}
		}
		if errors.Is(err, errConflict) {
			done()
			continue
		} else if err != nil {
			done()
			d.log.Error("taking over turn failed", "turn", key, "err", err)
			return
		}
		d.log.Warn("took over a turn stuck in submitting", "turn", key)
		d.submitClaimed(ctx, t, newRev, done)
		return
	}
}

// submit gathers the outputs of a turn this replica owns, gives them to
// the platform (retrying what may be retried, until the run expires) and
// records the outcome.
func (d *Dispatcher) submit(ctx context.Context, t *Turn, rev uint64) {
	done, ok := d.submittingHere(t.Key)
	if !ok {
		return // submitted here already, by the goroutine that claimed it first
	}
	d.submitClaimed(ctx, t, rev, done)
}

// submitClaimed is submit for a caller that marked the turn submitted
// here (submittingHere); done ends the mark.
func (d *Dispatcher) submitClaimed(ctx context.Context, t *Turn, rev uint64, done func()) {
	defer done()
	defer d.gather.forget(t.Key)
	ctx, span := d.tel.tracer.Start(d.tel.turnContext(ctx, t), d.tel.submitNames.Get(string(t.Ref.Platform), ""), otelconv.ClientSpan...)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(append(refAttrs(t.Ref), attrTurnKey.String(string(t.Key)), attrPlatform.String(string(t.Ref.Platform)),
			attrCalls.Int(len(t.Calls)), attrCutOff.Bool(t.Outcome().CutOff))...)
	}
	claim, sctx := d.claim(ctx, t, rev)
	outputs, err := d.outputs(sctx, t)
	var sub *Submission
	if err == nil {
		sub, err = d.submitWithRetry(sctx, t, outputs)
	}
	rev, since, lost := claim.end()
	t.writeOutcome().SubmittingSince = since
	if lost && err != nil {
		// Renewing the claim found another one: that replica submits the
		// turn (with the same ids) and records the outcome. A submission
		// that went through is recorded here all the same; the other
		// replica's renewal then finds the turn closed.
		span.SetStatus(codes.Error, "taken over by another replica")
		d.log.Warn("another replica took over this submission; leaving it to that replica", "turn", t.Key)
		d.closedElsewhere(t.Key)
		return
	}
	if err == nil {
		crashpoint.Reached(crashpoint.Submitted, string(t.Key))
	}
	if err != nil && errors.Is(context.Cause(ctx), errShutdown) {
		// The shutdown timeout cut the submission off. The turn stays in
		// submitting, released so that the restart or another replica
		// takes it over at once and submits it again with the same ids
		// (a repeat the platform already took counts as done).
		span.SetStatus(codes.Error, "cut off by the shutdown")
		d.releaseTurn(t.Key)
		return
	}
	now := time.Now().UTC()
	if span.IsRecording() {
		span.SetAttributes(attrTimeLeft.Int64(t.ExpiresAt.Sub(now).Milliseconds()))
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "submission failed")
	}
	// The platform answered: what it answered is recorded even when the
	// shutdown's timeout ended the work meanwhile (left unrecorded, the
	// turn would be submitted again by another replica), for a moment.
	mctx := ctx
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		mctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
	}
	final, cerr := d.markSubmitted(mctx, t, rev, func(r *Turn) {
		o := r.writeOutcome()
		o.SubmittedAt = now
		if err != nil {
			r.State = TurnFailed
			o.Error = err.Error()
			return
		}
		r.State = TurnSubmitted
		if sub != nil {
			o.Next = sub.Next
		}
	})
	if cerr != nil {
		// Left in submitting: the sweep takes it over and submits it again,
		// which the platform answers as already submitted.
		d.log.Error("recording the submission failed", "turn", t.Key, "err", cerr)
		return
	}
	if final == nil {
		// No longer in submitting: another replica took the turn over
		// (this one looked stuck) and recorded its outcome first.
		d.log.Info("the submission's outcome was recorded by another replica", "turn", t.Key)
		d.closedElsewhere(t.Key)
		return
	}
	d.closing.closed(final, outputs)
	d.tel.submitted(ctx, final, outputs, final.State, now)
	cutOff := t.Outcome().CutOff
	defer d.finished(final, cutOff)
	ev := Event{Kind: EventTurnSubmitted, Turn: final, Latency: now.Sub(t.CreatedAt), TimeLeft: t.ExpiresAt.Sub(now)}
	if err != nil {
		ev.Kind = EventTurnFailed
		d.log.ErrorContext(ctx, "submission failed", "turn", t.Key, "platform", t.Ref.Platform, "err", err)
	} else {
		d.log.InfoContext(ctx, "turn submitted", "turn", t.Key, "platform", t.Ref.Platform,
			"latency_ms", ev.Latency.Milliseconds(), "time_left_s", int64(ev.TimeLeft.Seconds()), "cut_off", cutOff)
	}
	d.emit(ev)
}

// finished does what follows the close of turn t, wherever it was closed
// (submitted, failed, cancelled, or found closed by the sweep): its span
// ends, this replica stops gathering for it, and its timer leaves the index
// of open turns (the fired one too, when fired: the deadline closed it or
// it is not known to be unfired).
func (d *Dispatcher) finished(t *Turn, fired bool) {
	d.tel.endTurn(t.Key, t.State, t.Outcome().Error)
	d.gather.forget(t.Key)
	d.unindex(t.Key, fired)
	d.recent.add(t.Key, time.Now())
}

// closedElsewhere drops a turn this replica gathered for that another
// replica closed (or is submitting).
func (d *Dispatcher) closedElsewhere(key protocol.TurnKey) {
	d.gather.forget(key)
	d.tel.endTurnOutcome(key, "closed by another replica", false, "")
}

// cutOffLate closes a turn found collecting past its deadline (its timer
// did not close it), submitting what it has.
func (d *Dispatcher) cutOffLate(key protocol.TurnKey, why string) {
	d.log.Warn(why, "turn", key)
	d.background(func(ctx context.Context) { d.closeTurn(ctx, key, true) })
}

// releaseTimeout bounds the write that releases a turn at shutdown.
const releaseTimeout = time.Second

// releaseTurn gives up this replica's claim (or hold) on a turn it was
// submitting when it stopped, so that takeOver (or another replica's
// claim) need not wait stuckAfter for it.
func (d *Dispatcher) releaseTurn(key protocol.TurnKey) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	t, rev, err := d.turns.get(ctx, key)
	switch {
	case err != nil:
		return
	case d.heldHere(t):
		t.out = nil // a held turn goes back to collecting
	case t.State != TurnSubmitting || t.Outcome().Owner != d.opts.Name:
		return
	default:
		claim := t.writeOutcome()
		claim.Owner, claim.SubmittingSince = "", time.Time{}
	}
	if _, err := d.turns.update(ctx, t, rev); err == nil {
		d.log.Info("submission cut off by the shutdown; the turn is left to the other replicas or the restart", "turn", key)
	}
}

// markSubmitted records how a submission of t (read at rev) ended. While
// JetStream fails over it keeps trying: a turn left in submitting is
// submitted again later. A try that timed out may have been stored, so
// later tries read the record, and one found closed is the outcome. A
// turn this process held is submitting by it (its record says so).
func (d *Dispatcher) markSubmitted(ctx context.Context, t *Turn, rev uint64, change func(*Turn)) (*Turn, error) {
	known := t
	submitting := func(r *Turn) bool { return r.State == TurnSubmitting || d.heldHere(r) }
	cleared := func(r *Turn) {
		if r.held() {
			r.claimHeld()
		}
		change(r)
	}
	return whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (*Turn, error) {
		final, _, err := d.turns.transitionIf(ctx, t.Key, submitting, known, rev, cleared)
		if known == nil && err == nil && final == nil {
			if r, _, gerr := d.turns.get(ctx, t.Key); gerr == nil && !r.Open() {
				return r, nil // stored by a try that timed out
			}
		}
		known = nil
		return final, err
	})
}

// resultReadFor bounds how long reading a recorded result is retried while
// JetStream is unavailable; the read also stops submitLeeway before the run
// expires, so the submission still has time, but is given minResultRead at
// least.
const (
	resultReadFor = 30 * time.Second
	submitLeeway  = 2 * time.Second
	minResultRead = time.Second
)

// outputs lists the result of every call, in the turn's order.
func (d *Dispatcher) outputs(ctx context.Context, t *Turn) ([]Output, error) {
	out := make([]Output, 0, len(t.Calls))
	// One allowance for results that read as missing, for the whole turn.
	lagUntil := time.Now().Add(min(resultLagFor, max(time.Until(t.ExpiresAt)-submitLeeway, 0)))
	for i := range t.Calls {
		c := &t.Calls[i]
		var res *protocol.Result
		if timedOut(t, c.Key) {
			res = &protocol.Result{
				Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
				Error: &protocol.CallError{Code: protocol.CodeTimeout,
					Message: fmt.Sprintf("%s timed out after %s. Continue without its result, or try again with a simpler request.",
						c.Name, t.Deadline.Sub(t.CreatedAt).Round(time.Second))},
				FinishedAt: t.Outcome().SubmittingSince,
			}
		} else {
			var err error
			// A result gathered here is in hand. Any other (gathered by
			// another replica, or before a restart) is read from the
			// stream; a read that times out while JetStream fails over is
			// tried again: the result is recorded, and failing the turn
			// for it would throw the whole submission away. The run's
			// expiry bounds the wait.
			if res = d.gather.local(t.Key, c.Key); res == nil {
				within := min(max(time.Until(t.ExpiresAt)-submitLeeway, minResultRead), resultReadFor)
				res, err = d.recordedResult(ctx, t, c, within, lagUntil)
			}
			if err == nil && (res.Key != c.Key || res.Team != c.Team) {
				err = errors.New("the recorded result names another call")
			}
			if err != nil && !errors.Is(err, ErrUnavailable) && ctx.Err() == nil {
				// Not a passing failure: the result never appeared, or
				// what holds its subject is not a result of this call
				// (the first message on it wins, so no result will
				// follow). That call fails; the turn's others go out.
				d.log.Warn("a call's recorded result cannot be read; submitting it as failed", "turn", t.Key, "call", c.Key, "err", err)
				res, err = &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
					Error: &protocol.CallError{Code: protocol.CodeUnavailable,
						Message: fmt.Sprintf("The result of %s could not be read. Continue without it.", c.Name)},
					FinishedAt: t.Outcome().SubmittingSince}, nil
			}
			if err != nil {
				return nil, fmt.Errorf("dispatch: result of call %s (%s): %w", c.ID, c.Name, err)
			}
		}
		out = append(out, Output{Call: *c, Result: res})
	}
	return out, nil
}

// resultLagFor bounds how long a result known to be recorded may read as
// not found. Results are read from the stream's leader, which holds every
// result acknowledged; before, a direct get answered by a replica that
// had not stored it yet failed a whole turn in a chaos soak, and the
// allowance stays for whatever else may answer so for a moment.
const resultLagFor = 2 * time.Second

// recordedResult reads the result of c, known to be recorded: it is tried
// again while JetStream is unavailable (up to within) and while it reads
// as not found (until giveUp).
func (d *Dispatcher) recordedResult(ctx context.Context, t *Turn, c *TurnCall, within time.Duration, giveUp time.Time) (*protocol.Result, error) {
	lag := backoff.Backoff{Initial: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	for {
		res, err := whileUnavailable(ctx, within, func(ctx context.Context) (*protocol.Result, error) {
			return d.gather.result(ctx, t, c)
		})
		if !errors.Is(err, jetstream.ErrMsgNotFound) || time.Now().After(giveUp) {
			return res, err
		}
		if !backoff.Sleep(ctx, lag.Next()) {
			return nil, err
		}
	}
}

// withoutResult lists the calls of t, cut off at its deadline, that have
// no result: none seen here, and none in the stream as its leader tells.
// If the stream cannot be asked, each result is read instead.
func (d *Dispatcher) withoutResult(ctx context.Context, t *Turn) []protocol.CallKey {
	recorded, err := d.gather.recorded(ctx, t)
	var missing []protocol.CallKey
	for i := range t.Calls {
		c := &t.Calls[i]
		switch {
		case d.gather.local(t.Key, c.Key) != nil:
		case err == nil:
			if !recorded[c.Key] {
				missing = append(missing, c.Key)
			}
		default:
			if _, rerr := d.gather.result(ctx, t, c); rerr != nil {
				missing = append(missing, c.Key)
			}
		}
	}
	return missing
}

func timedOut(t *Turn, key protocol.CallKey) bool {
	for _, k := range t.Outcome().TimedOut {
		if k == key {
			return true
		}
	}
	return false
}

// submitAttemptTimeout bounds one request submitting a turn's outputs.
const submitAttemptTimeout = 30 * time.Second

// lastAttemptLead is how long before a run's expiry the last submission
// attempt goes out.
const lastAttemptLead = time.Second

// submitWithRetry retries 429, 5xx and transport errors with exponential
// backoff and jitter, honouring Retry-After, until the run expires or ctx
// ends (with errTakenOver: another replica took the submission).
func (d *Dispatcher) submitWithRetry(ctx context.Context, t *Turn, outputs []Output) (*Submission, error) {
	p := d.platforms[t.Ref.Platform]
	if p == nil {
		return nil, fmt.Errorf("dispatch: no adapter for platform %q", t.Ref.Platform)
	}
	retry := backoff.Backoff{Initial: 250 * time.Millisecond, Max: 8 * time.Second}
	for attempt := 1; ; attempt++ {
		// Each attempt ends by the run's expiry (the waits between them
		// do too: retryWait keeps them short of it), so one context per
		// attempt bounds both.
		actx, acancel := context.WithDeadline(ctx, earliest(t.ExpiresAt, time.Now().Add(submitAttemptTimeout)))
		sub, err := p.Submit(actx, t, outputs)
		acancel()
		if err == nil {
			return sub, nil
		}
		var pe *PlatformError
		if !errors.As(err, &pe) || !pe.Retryable {
			return nil, err
		}
		wait, ok := retryWait(time.Until(t.ExpiresAt), retry.Next(), pe.RetryAfter)
		if !ok {
			return nil, fmt.Errorf("%w (gave up after %d attempts: the run expires before another)", err, attempt)
		}
		d.log.Warn("submission failed; retrying", "turn", t.Key, "attempt", attempt, "wait", wait.String(), "err", err)
		if !backoff.Sleep(ctx, wait) {
			if errors.Is(context.Cause(ctx), errTakenOver) {
				return nil, errTakenOver
			}
			return nil, fmt.Errorf("%w (gave up: %v)", err, context.Cause(ctx))
		}
	}
}

// retryWait is how long to wait before the next submission attempt, with
// left until the run expires, backoff the next step of the backoff and
// retryAfter what the platform asked for; false if no attempt fits.
//
// The backoff is cut to a quarter of the time left, so attempts come
// closer together as expiry nears instead of sleeping through the moments
// the platform answers again (a soak lost a run waiting 6 s of its last 11
// between two rate limits). The platform's Retry-After stands. A wait that
// would outlast the run is cut short: one last attempt goes out just before
// it expires, and only when there is no time for that does the submission
// give up.
func retryWait(left, backoff, retryAfter time.Duration) (time.Duration, bool) {
	wait := max(retryAfter, min(backoff, left/4))
	if last := left - lastAttemptLead; wait > last {
		if last <= 0 {
			return 0, false
		}
		wait = last
	}
	return wait, true
}

// lateResult notes a result that arrived after its turn was closed: it is
// recorded in the stream, but the turn was submitted without it.
func (d *Dispatcher) lateResult(ctx context.Context, t *Turn) {
	d.tel.late.Add(ctx, 1)
	d.log.InfoContext(ctx, "late result for a closed turn; recorded, not submitted", "turn", t.Key, "state", t.State)
}

// earliest returns the earlier of a and b.
func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
