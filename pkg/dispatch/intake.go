package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"

	"github.com/toolrelay/toolrelay/internal/crashpoint"
	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Intake takes in a required action: it records the turn, arms its deadline
// and publishes one call per function call. Calls that cannot work (unknown
// function, arguments that are not JSON or break the schema) get a failed
// result at once and run nowhere.
//
// Intake is idempotent: the same required action seen again (another
// channel, another replica) returns the existing turn.
func (d *Dispatcher) Intake(ctx context.Context, req *TurnRequest) (*Turn, error) {
	if _, ok := d.platforms[req.Ref.Platform]; !ok {
		return nil, fmt.Errorf("dispatch: no adapter for platform %q", req.Ref.Platform)
	}
	if len(req.Calls) == 0 {
		return nil, errors.New("dispatch: a turn needs at least one call")
	}
	// No read first: the record's compare-and-set create tells a duplicate
	// (the same action from another channel or replica) apart, and saves a
	// round trip on every new turn.
	key := req.Key()
	now := time.Now()
	t := &Turn{
		Version: protocol.Version, Key: key, Ref: req.Ref, Scope: req.Scope, TurnID: req.TurnID,
		State: TurnCollecting, CreatedAt: now.UTC(), ExpiresAt: req.ExpiresAt,
	}
	if t.ExpiresAt.IsZero() {
		t.ExpiresAt = now.Add(d.opts.RunTTL)
	}
	t.ExpiresAt = t.ExpiresAt.UTC()
	t.Deadline = t.ExpiresAt.Add(-d.margin(t.ExpiresAt.Sub(now)))
	if !req.Deadline.IsZero() && req.Deadline.Before(t.ExpiresAt) {
		t.Deadline = req.Deadline.UTC()
	}

	if existing, err := d.stepOf(ctx, req, key); existing != nil || err != nil {
		return existing, err // the rest of a step taken in already, or unknown yet
	}
	// Resolve every call first: the record must say which team owns each.
	failures, checked, holds, err := d.resolveCalls(ctx, t, req.Calls)
	if err != nil {
		return nil, err
	}
	// Every call key starts with the turn key: held as part of the first,
	// the turn key costs an open turn no memory of its own.
	t.Key = t.Calls[0].Key.Turn()
	key = t.Key
	// A context that ended while the calls were resolved (the dispatcher
	// is stopping) may have turned a lookup's cancellation into a
	// rejection: record nothing, and let the restart or another replica
	// take the turn in.
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("dispatch: take in turn %s: %w", key, err)
	}
	return d.takeIn(ctx, t, req.Channel, failures, checked, holds)
}

// takeIn records the resolved turn t and sends its calls out: Intake's
// second half, its own function so that the first's frame is not on the
// stack while the calls' arguments are checked.
func (d *Dispatcher) takeIn(ctx context.Context, t *Turn, channel string, failures map[protocol.CallKey]*protocol.CallError, checked []string,
	holds map[protocol.CallKey]*hold) (*Turn, error) {
	key := t.Key
	// Owned from the start by this replica (docs/turns.md), which then
	// submits it with no write between its last result and its platform.
	t.lease = d.engine.IntakeLease(t.CreatedAt, t.Deadline)
	tctx, span := d.tel.startTurn(ctx, t)
	var held map[protocol.CallKey]bool // most turns hold no call
	if holds != nil {
		var err error
		if held, err = d.holdCalls(tctx, t, holds); err != nil {
			span.SetStatus(codes.Error, err.Error())
			span.End()
			return nil, err
		}
	}
	rev, err := d.record(ctx, t)
	if errors.Is(err, errConflict) {
		span.SetAttributes(attrOutcome.String("duplicate"))
		span.End() // another channel or replica took it in
		existing, _, err := d.turns.get(ctx, key)
		if err == nil && existing.State == TurnCollecting {
			d.republishCalls(ctx, existing)
		}
		return existing, err
	} else if err != nil {
		span.SetStatus(codes.Error, err.Error())
		span.End()
		return nil, fmt.Errorf("dispatch: record turn %s: %w", key, err)
	}
	d.tel.keepTurn(key, span)
	// Tracked at once: a replica that stops from now on releases its lease.
	d.gather.takeIn(t, rev)
	if d.engine.Stopping() {
		// The stop's release ran before this turn was tracked, and the
		// engine starts no goroutine any more: give the lease up here.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		d.engine.ReleaseNow(rctx, rec(t, rev))
		cancel()
	}
	// The turn is recorded and this replica gathers for it, so the sweep
	// will not resume it: its failures and calls must go out now, even if
	// the caller goes away meanwhile (a webhook's connection closed). A
	// stopping dispatcher cuts them off; its restart's sweep resumes the
	// turn.
	ctx, stop := d.detached(tctx)
	defer stop()
	crashpoint.Reached(crashpoint.Intake, d.opts.Name, string(key))
	channel = cmp.Or(channel, "api")
	d.tel.takenIn.Add(ctx, 1, d.tel.sets.Add(attrPlatform.String(string(t.Ref.Platform)), attrChannel.String(channel))...)
	d.emit(Event{Kind: EventTurnStarted, Turn: t})
	d.log.InfoContext(tctx, "turn taken in", "turn", key, "platform", t.Ref.Platform, "scope", t.Scope, "calls", len(t.Calls),
		"deadline", t.Deadline, "channel", channel)

	for k, cerr := range failures {
		c := t.call(k)
		d.recordFailure(ctx, t, c, cerr)
	}
	d.answerSelf(ctx, t, nil)
	if held != nil {
		d.announceHolds(ctx, t, held)
	}
	d.publishCalls(ctx, t, held, checked)
	crashpoint.Reached(crashpoint.Fanout, d.opts.Name, string(key))
	return t, nil
}

// republishCalls publishes again the calls of a collecting turn that have
// no result, for a repeat of its intake: whoever recorded it may not have
// published them (an intake whose record was stored but whose
// acknowledgement was lost in a failover fails, and its retry lands here).
// A call still queued or running is stored, so its message ID drops the
// repeat. One that ran is not: its executor's acknowledgement deleted it,
// and a server that restarts rebuilds its message IDs from what it
// stores, so only the recorded result tells that it ran. The results are
// read again while JetStream is unavailable; if they still cannot be read,
// nothing is published (a repeat of the intake tries again).
func (d *Dispatcher) republishCalls(ctx context.Context, t *Turn) {
	ctx, stop := d.detached(ctx) // as Intake: once begun, the caller may go
	defer stop()
	recorded, err := whileUnavailable(ctx, d.unavailableFor, func(ctx context.Context) (map[protocol.CallKey]bool, error) {
		return d.gather.recorded(ctx, t, nil)
	})
	if err != nil {
		d.log.Warn("a repeated intake could not read the turn's results; publishing none of its calls again", "turn", t.Key, "err", err)
		return
	}
	d.answerSelf(ctx, t, recorded)
	d.publishCallsAgain(ctx, t, d.settleHeld(ctx, t, recorded))
}

// publishCallsAgain publishes again the calls of t without a result while
// the calls stream still drops a repeat of any that went out: until
// protocol.CallDuplicateWindow, less republishMargin, after the turn was
// taken in (its calls were published after its record was written, so
// each publication is younger than the turn). Past it, a call still queued
// or running would be queued twice and run twice, so none is published: a
// call the turn's intake never sent (it stopped mid-fan-out, and no
// replica looked at the turn within the window) fails at the deadline as
// timed out.
func (d *Dispatcher) publishCallsAgain(ctx context.Context, t *Turn, recorded map[protocol.CallKey]bool) {
	if !repeatDropped(t.CreatedAt) {
		age := time.Since(t.CreatedAt)
		d.log.Warn("turn older than its calls' duplicates window: none of its calls is published again, as a repeat could run one twice",
			"turn", t.Key, "age", age.Round(time.Second), "window", protocol.CallDuplicateWindow)
		return
	}
	d.publishCalls(ctx, t, recorded, nil)
}

// repeatDropped reports whether a call first published no earlier than
// since is still within the calls stream's duplicates window, less
// republishMargin: a repeat of it now is dropped by its message ID.
func repeatDropped(since time.Time) bool {
	return time.Since(since) <= protocol.CallDuplicateWindow-republishMargin
}

// republishMargin allows for the clocks of the replica that took a turn in
// and of the server that stamps its calls' publications.
const republishMargin = 30 * time.Second

// resolveCalls adds req's calls to t, each with the team that owns it, and
// returns the failures of those that cannot work (marked Rejected), in
// the order of t.Calls the digest of the schema each other call's
// arguments were checked against, and the holds of the calls their
// function's approval policy holds.
func (d *Dispatcher) resolveCalls(ctx context.Context, t *Turn, calls []CallRequest) (map[protocol.CallKey]*protocol.CallError, []string, map[protocol.CallKey]*hold, error) {
	var failures map[protocol.CallKey]*protocol.CallError // most turns have none
	var holds map[protocol.CallKey]*hold                  // nor holds
	checked := make([]string, len(calls))
	t.Calls = make([]TurnCall, 0, len(calls))
	budget := turnArgumentsBudget
	for i, c := range calls {
		if slices.ContainsFunc(calls[:i], func(o CallRequest) bool { return o.ID == c.ID }) {
			return nil, nil, nil, fmt.Errorf("dispatch: call ID %q appears twice in one turn", c.ID)
		}
		tc := TurnCall{ID: c.ID, Name: c.Name, Key: t.Key.Call(c.ID), Team: protocol.SystemTeam, Arguments: c.Arguments, Custom: c.Custom}
		stored := tc.Arguments // as the record keeps them
		if !json.Valid(stored) {
			stored = mustJSONString(string(stored))
		}
		cerr := oversized(tc.Name, len(stored), budget)
		switch {
		case cerr != nil:
			stored = mustJSONString(fmt.Sprintf("(%d bytes, not kept)", len(stored)))
		case c.ToolSearch:
			// Answered by this dispatcher (answerSearches), from the
			// registry: no team, no schema.
			tc.ToolSearch = true
			if tc.Name == "" {
				tc.Name = "tool_search"
			}
		default:
			var h *hold
			if c.MCPServer != "" {
				// Decided by this dispatcher (mcpapproval.go).
				tc.MCPServer = c.MCPServer
				h, cerr = d.resolveMCPApproval(ctx, &tc)
			} else if checked[i], h, cerr = d.resolve(ctx, &tc, d.opts.ServeGrace); h != nil && t.Ref.Platform == protocol.PlatformMCP &&
				d.takeGrant(ctx, tc.Name, tc.Arguments) {
				h, tc.Approval = nil, false // its MCP approval request was approved
			}
			if h != nil {
				if holds == nil {
					holds = map[protocol.CallKey]*hold{}
				}
				holds[tc.Key] = h
			}
		}
		if cerr != nil {
			if failures == nil {
				failures = map[protocol.CallKey]*protocol.CallError{}
			}
			failures[tc.Key] = cerr
			tc.Rejected = true
		} else {
			budget -= len(stored)
		}
		tc.Arguments = stored
		t.Calls = append(t.Calls, tc)
	}
	return failures, checked, holds, nil
}

// The turn record carries every call's arguments (a replica that resumes
// the turn publishes them again), and a record must fit in one message.
// So one call's arguments may be at most protocol.MaxArgumentsSize, and a
// turn's together at most turnArgumentsBudget; a call over either limit
// fails at intake with a reason the model can act on, and its arguments
// are not kept.
const turnArgumentsBudget = 3 * protocol.MaxArgumentsSize

// oversized returns the failure of a call whose arguments, n bytes, are
// over the limits, budget being what the turn has left; or nil.
func oversized(name string, n, budget int) *protocol.CallError {
	var limit string
	switch {
	case n > protocol.MaxArgumentsSize:
		limit = fmt.Sprintf("more than the %d KiB a call may carry", protocol.MaxArgumentsSize>>10)
	case n > budget:
		limit = fmt.Sprintf("more than the %d KiB this turn's calls may carry together", turnArgumentsBudget>>10)
	default:
		return nil
	}
	return &protocol.CallError{Code: protocol.CodeInvalidArguments,
		Message: fmt.Sprintf("The arguments for %s are %d KiB, %s. Call it again with smaller arguments.", name, (n+1023)>>10, limit)}
}

// record makes the turn durable: its deadline timer, its record (created
// by compare-and-set: errConflict if it exists) and, for an Agents session,
// its step are published together, and the calls only go out once all are
// stored. The timer's subjects are also the index of open turns the sweep
// reads. It returns the record's revision.
func (d *Dispatcher) record(ctx context.Context, t *Turn) (uint64, error) {
	b, err := encodeTurn(t)
	if err != nil {
		return 0, err
	}
	// Beside the record go the writes that must exist once it does: the
	// timer (or the turn has no deadline and the sweep never sees it) and
	// the step (or its remaining calls are taken in again). Each can be
	// written again safely.
	beside := []companion{{failed: "arming deadline failed; the turn has no deadline", again: func(ctx context.Context) error { return d.scheduleDeadline(ctx, t) }}}
	if beside[0].ack, err = d.scheduleDeadlineAsync(t); err != nil {
		return 0, err
	}
	if step, err := d.stepAsync(t); err != nil {
		return 0, err
	} else if step != nil {
		beside = append(beside, companion{failed: "remembering the step failed; its remaining calls may be taken in again", ack: step, again: func(ctx context.Context) error { return d.rememberStep(ctx, t) }})
	}
	rec, err := d.async.Publish(&nats.Msg{Subject: kvSubject(provision.TurnBucket, string(t.Key)), Data: b.Bytes(),
		Header: jspub.SetHeaders(nil, jetstream.ExpectedLastSubjSeqHeader, "0")}) // created, not overwritten
	if err != nil {
		return 0, err
	}
	seq, err := awaitAck(ctx, rec)
	if err == nil || firstwins.Lost(err) {
		// Answered: the client will not publish b again. (After a
		// timeout or while no server answers, it may still retry.)
		b.release()
	}
	if firstwins.Lost(err) {
		// Another intake recorded the turn. What went out beside this
		// attempt still repairs what that intake may not have stored: a
		// dispatcher that died with its embedded server between the
		// record and the timer (two streams, stored apart) left the turn
		// with no deadline, and this repeat arms it.
		d.awaitBeside(ctx, t, beside)
		return 0, errConflict
	}
	if err != nil {
		return 0, err
	}
	d.awaitBeside(ctx, t, beside)
	return seq, nil
}

// awaitBeside waits for the writes published beside t's record, each
// written again while JetStream fails over if it failed: the record
// exists, so they must too.
func (d *Dispatcher) awaitBeside(ctx context.Context, t *Turn, beside []companion) {
	for _, c := range beside {
		if _, err := awaitAck(ctx, c.ack); err != nil {
			if _, err := whileUnavailable(ctx, armRetryFor, func(ctx context.Context) (struct{}, error) {
				return struct{}{}, c.again(ctx)
			}); err != nil {
				d.log.ErrorContext(ctx, c.failed, "turn", t.Key, "err", err)
			}
		}
	}
}

// companion is a write published beside a turn's record: its pending
// acknowledgement, how to write it again, and what to log if that fails.
type companion struct {
	ack    *jspub.Future
	again  func(context.Context) error
	failed string
}

// armRetryFor bounds how long arming a recorded turn's deadline is
// retried: longer than a cluster's leader election.
const armRetryFor = 30 * time.Second

// recordFailure records a failed result for c, first-wins like any result.
func (d *Dispatcher) recordFailure(ctx context.Context, t *Turn, c *TurnCall, cerr *protocol.CallError) {
	// The replica records into a stream it consumes: the turn's results reach
	// it only so (a call to a team first seen by another replica can be
	// refused before it is routed).
	if _, err := d.gather.streams.stream(ctx, c.Team); err != nil {
		d.log.Warn("cannot provision the team's result stream", "team", c.Team, "err", err)
	}
	res := &protocol.Result{
		Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
		Error: cerr, Executor: "dispatcher/" + d.opts.Name, FinishedAt: time.Now().UTC(),
	}
	if err := firstwins.Record(ctx, d.js.Conn(), res, nil, t.resultTTL(time.Now())); err != nil && ctx.Err() == nil {
		// The replica that resumes the turn records it again; failing
		// that, the deadline closes the turn with a failure for this call.
		d.log.Error("recording failure result failed", "turn", t.Key, "call_key", c.Key, "err", err)
	}
}

// safeName keeps a result valid even for a call whose name is not a valid
// function name (the model made one up).
func safeName(name string) string {
	if protocol.ValidateFunctionName(name) == nil {
		return name
	}
	return "invalid_function_name"
}

func mustJSONString(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}
