package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A watch's driver: the loop that polls its object (and follows its event
// stream), takes each required action in, waits for the turn to close and
// moves on, and what becomes of the watch when its dispatcher stops.

// maxPollInterval is the longest a driver waits between polls of an
// object that does not change.
const maxPollInterval = 5 * time.Second

// drive polls w's object and takes in each required action until the
// object is done, failed, or MaxSteps turns were driven. It is longer than
// our usual functions because it is the watch's state machine: every answer
// the platform can give, and how each ends the watch or polls again, reads
// in one place.
func (d *Dispatcher) drive(ctx context.Context, w *Watch) (handedOver bool) {
	// Drivers stop at once on shutdown; the watch stays active in the
	// bucket and a restarted dispatcher resumes it. An intake already begun
	// runs on under background, which ends with the shutdown timeout (see
	// intakeForWatch).
	background := ctx
	ctx, stop := d.withRunContext(ctx)
	defer stop()
	log := d.log.With("watch", w.ID, "ref", w.Ref.String())
	p := d.platforms[w.Ref.Platform]
	// Polls slow down while the object is unchanged, and start again at
	// PollInterval when it changes.
	polls := backoff.Backoff{Initial: d.opts.PollInterval, Max: maxPollInterval, Factor: 1.5}
	// wake brings the turns the event stream took in: each is listed on
	// the watch (and counted against MaxSteps) as a polled one is, even if
	// it is submitted before the next poll could see it. A nil one asks
	// for a poll now: the stream (re)opened, and what came before it is
	// not replayed.
	wake := make(chan *TurnRequest, 1)
	var streamed *TurnRequest
	wait := func() {
		t := time.NewTimer(polls.Next())
		defer t.Stop()
		select {
		case <-t.C:
		case streamed = <-wake:
			if streamed == nil {
				polls.Reset()
			}
		case <-ctx.Done():
		}
	}
	if f, ok := p.(Follower); ok {
		fctx, stopFollowing := context.WithCancel(ctx)
		var following sync.WaitGroup
		following.Go(func() { d.follow(fctx, f, w, wake, log) })
		defer func() { stopFollowing(); following.Wait() }()
	}
	finish := func(state WatchState, answer, reason string) {
		w.State, w.Answer, w.Error = state, answer, reason
		ours, saved := d.storeWatch(ctx, w)
		retry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
		for giveUp := time.Now().Add(d.unavailableFor); ours && !saved && time.Now().Before(giveUp); {
			if !backoff.Sleep(ctx, retry.Next()) {
				break
			}
			ours, saved = d.storeWatch(ctx, w)
		}
		switch {
		case !ours:
			log.Info("watch ended here, but another replica drives or finished it; its record stands", "state", state)
		case !saved:
			// Left active, so that stopping releases it and the next
			// driver finds the outcome again.
			w.State, w.Answer, w.Error = WatchActive, "", ""
			log.Warn("watch ended, but its outcome could not be saved; the next driver finds it again", "state", state)
		default:
			log.Info("watch ended", "state", state, "reason", reason)
		}
	}
	lastSave := time.Now()
	for ctx.Err() == nil {
		if time.Since(lastSave) > d.watchSaveEvery {
			if !d.keepWatch(ctx, w) { // keep UpdatedAt fresh: this watch is alive
				return true
			}
			lastSave = time.Now()
		}
		var obs *Observation
		var err error
		polled := streamed == nil
		if !polled {
			obs, streamed = &Observation{State: ObjectRequiresAction, Turn: streamed}, nil
		} else {
			obs, err = p.Poll(ctx, w.Current)
		}
		if err != nil {
			var pe *PlatformError
			if errors.As(err, &pe) && !pe.Retryable {
				finish(WatchFailed, "", err.Error())
				return false
			}
			log.Warn("poll failed; retrying", "err", err)
			wait()
			continue
		}
		if polled && obs.State != ObjectUnsupported {
			// What the object waits on now replaces what it waited on.
			if !d.noteUnsupported(ctx, w, obs.Unsupported, log) {
				return true
			}
		}
		switch obs.State {
		case ObjectRunning:
			wait()
		case ObjectUnsupported:
			if !d.noteUnsupported(ctx, w, obs.Unsupported, log) {
				return true
			}
			if !w.Current.canMoveOn() {
				finish(WatchUnsupported, "", unsupportedReason(w.Current, obs.Unsupported))
				return false
			}
			wait() // someone else may answer it; the object then moves on
		case ObjectDone:
			finish(WatchCompleted, obs.Answer, "")
			return false
		case ObjectFailed:
			d.cancelTurns(ctx, w, obs.Reason)
			finish(WatchFailed, "", obs.Reason)
			return false
		case ObjectRequiresAction:
			if len(w.Turns) >= d.opts.MaxSteps {
				finish(WatchFailed, "", fmt.Sprintf("stopped after %d turns (the max-steps limit)", d.opts.MaxSteps))
				return false
			}
			if obs.Turn.Channel == "" {
				obs.Turn.Channel = "poll"
			}
			t, fresh, err := d.intakeForWatch(d.tel.prop.Extract(ctx, &w.Trace), background, obs.Turn, w)
			if errors.Is(err, errHandedOver) {
				return true
			}
			if err != nil {
				if ctx.Err() != nil {
					return false // stopping: the watch is released, and the turn resumed wherever it is taken
				}
				log.Error("intake failed; retrying", "err", err)
				wait()
				continue
			}
			handedOver := false
			t, _, ended, err := d.awaitClosed(ctx, t.Key, p, w.Current, func() bool {
				// A long turn: the watch stays alive meanwhile.
				if time.Since(lastSave) > d.watchSaveEvery {
					handedOver, lastSave = !d.keepWatch(ctx, w), time.Now()
				}
				return !handedOver
			})
			if handedOver {
				return true
			}
			if err != nil {
				return false // shutting down; the sweep picks it up
			}
			if ended != nil {
				// The platform cancelled, expired or finished the run while
				// its calls were still running: stop them.
				d.cancelTurns(ctx, w, ended.Reason)
				finish(WatchFailed, "", ended.Reason)
				return false
			}
			if t.State == TurnFailed {
				finish(WatchFailed, "", "submission failed: "+t.Outcome().Error)
				return false
			}
			if next := t.Outcome().Next; next != nil {
				w.Current = *next
				d.indexResponse(ctx, w.Current.ResponseID, w.ID)
			}
			if !d.keepWatch(ctx, w) {
				return true
			}
			lastSave = time.Now()
			if fresh {
				polls.Reset()
			} else {
				wait() // the platform has not caught up with our submission
			}
		}
	}
	return false
}

// noteUnsupported records on the watch what its object waits on that
// toolrelay does not serve (items; none: nothing), and says so once per
// item: a log line naming the object and the item, and the
// toolrelay.platform.unsupported counter by item type. It saves the watch
// when that changed, and reports false if another replica drives it now.
func (d *Dispatcher) noteUnsupported(ctx context.Context, w *Watch, items []UnsupportedItem, log *slog.Logger) bool {
	if slices.Equal(w.Unsupported, items) {
		return true
	}
	for _, it := range items {
		if slices.Contains(w.Unsupported, it) {
			continue
		}
		d.tel.unsupported.Add(ctx, 1, d.tel.sets.Add(attrPlatform.String(string(w.Current.Platform)), attrItemType.String(it.Type))...)
		log.WarnContext(ctx, "the platform waits on something toolrelay does not serve; answer it there, or the object will not move on",
			"object", w.Current.String(), "item_type", it.Type, "item_id", it.ID)
	}
	if len(items) == 0 {
		log.InfoContext(ctx, "the object no longer waits on anything toolrelay does not serve", "object", w.Current.String())
	}
	w.Unsupported = slices.Clone(items)
	return d.keepWatch(ctx, w)
}

// unsupportedReason is the error of a watch whose object ended on items
// toolrelay does not serve.
func unsupportedReason(ref Ref, items []UnsupportedItem) string {
	names := make([]string, len(items))
	for i, it := range items {
		names[i] = it.Type
		if it.ID != "" {
			names[i] += " " + it.ID
		}
	}
	return fmt.Sprintf("%s ended on what toolrelay does not serve (%s): nothing of it was answered, and the conversation is not done",
		ref.String(), strings.Join(names, ", "))
}

// follow takes in the required actions a platform's event stream reports
// (reconnecting with backoff) and wakes the driver, which then finds the
// turn already recorded. Webhook, stream and poll agree on the turn key, so
// the same required action is one turn whichever channel saw it first.
func (d *Dispatcher) follow(ctx context.Context, f Follower, w *Watch, wake chan *TurnRequest, log *slog.Logger) {
	tctx := d.tel.prop.Extract(ctx, &w.Trace)
	reconnect := backoff.Backoff{Initial: 250 * time.Millisecond, Max: 30 * time.Second}
	for ctx.Err() == nil {
		started := time.Now()
		err := f.Follow(ctx, w.Ref, &FollowEvents{
			Open: func() {
				select {
				case wake <- nil: // a turn waiting there brings a poll too
				default:
				}
			},
			Found: func(req *TurnRequest) {
				req.Channel = "stream"
				// Taken in at once, so its calls go out without waiting for
				// the driver; the driver then lists it on the watch.
				if _, err := d.Intake(tctx, req); err != nil {
					log.WarnContext(ctx, "stream intake failed; polling will retry", "err", err)
				}
				for { // the newest turn wins a place the driver has not read
					select {
					case wake <- req:
						return
					default:
					}
					select {
					case <-wake:
					default:
					}
				}
			},
		})
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > time.Minute {
			reconnect.Reset() // it was healthy for a while
		}
		wait := reconnect.Next()
		log.DebugContext(ctx, "event stream ended; reconnecting", "err", err, "in", wait.String())
		backoff.Sleep(ctx, wait)
	}
}

// intakeForWatch takes the turn in and adds it to the watch; fresh reports
// whether this call created it. The turn is listed in the watch before the
// intake, so a crash in between leaves the watch naming its turn.
//
// The intake itself runs under background (the driver's context before
// shutdown cuts it), not ctx: an intake cut short between storing the
// turn's record, which holds the turn for this replica, and hearing that it
// was stored never tracks the turn, so a stopping replica cannot release
// that hold, and the replica that drives the watch next waits stuckAfter
// (15 s) for it. Finished, the turn is tracked and its hold released with
// the others at shutdown.
func (d *Dispatcher) intakeForWatch(ctx, background context.Context, req *TurnRequest, w *Watch) (*Turn, bool, error) {
	key := req.Key()
	for _, k := range w.Turns {
		if k == key {
			t, rev, err := d.turns.get(ctx, key)
			if err == nil {
				if t.State == TurnCollecting && !d.gather.tracking(key) {
					// A driver taking over from a replica that stopped
					// mid-intake: the turn is recorded but its calls may
					// never have gone out. Resume it now rather than wait
					// for the sweep to find it stuck.
					d.resumeTurn(ctx, t, rev)
				}
				return t, false, nil
			}
			if !errors.Is(err, jetstream.ErrKeyNotFound) {
				return nil, false, err
			}
			break // listed, but the intake never happened: do it now
		}
	}
	if !slices.Contains(w.Turns, key) {
		w.Turns = append(w.Turns, key)
		switch ours, saved := d.storeWatch(ctx, w); {
		case !ours:
			return nil, false, errHandedOver
		case !saved: // the turn must be listed before it is taken in
			w.Turns = w.Turns[:len(w.Turns)-1]
			return nil, false, errors.New("dispatch: the watch could not be saved before its turn's intake")
		}
	}
	t, err := d.Intake(d.tel.prop.Extract(background, &w.Trace), req)
	if err != nil {
		return nil, false, err
	}
	return t, true, nil
}

// While a turn is open, awaitClosed asks the platform whether it still
// waits for it after closedPollFirst, then less and less often, down to
// every closedPollMax: the platform ending a run early is rare, and its
// answer only saves the turn's wait for the deadline. It reads the turn's
// record every recordReadEvery.
const (
	closedPollFirst = 2 * time.Second
	closedPollMax   = 10 * time.Second
	recordReadEvery = time.Second
)

// awaitClosed waits until a turn is submitted or failed, polling the
// platform meanwhile (unless p is nil): if the platform stops waiting for
// the turn (the run was cancelled, expired or finished), it returns that
// observation.
//
// A turn this process closes is handed over at once, with its outputs
// (nil when not known). Every write of the record is heard as it is published, by a plain
// subscription to its subject, whichever replica writes it; one that
// closes the turn is confirmed by reading the record (a write heard may
// have lost its compare-and-set). The record is also read once the
// subscription is in place, and every recordReadEvery, so a write missed
// (published before the subscription, or while the connection was away)
// costs a second, not the turn. A KV watch would bring the same news,
// through an ordered consumer created and deleted for each wait: on the
// MCP path that was most of a no-op call's time (docs/benchmarks.md).
func (d *Dispatcher) awaitClosed(ctx context.Context, key protocol.TurnKey, p Platform, ref Ref, keep func() bool) (*Turn, []Output, *Observation, error) {
	here, stop := d.closing.wait(key)
	defer stop()
	heard := make(chan struct{}, 1)
	if sub, err := d.turns.nc.Subscribe(kvSubject(provision.TurnBucket, string(key)), func(m *nats.Msg) {
		if t, err := decodeTurn(m.Data); err == nil && closedTurn(t) {
			select {
			case heard <- struct{}{}:
			default:
			}
		}
	}); err == nil {
		defer func() { _ = sub.Unsubscribe() }()
	}
	if t, _, err := d.turns.get(ctx, key); err == nil && closedTurn(t) {
		return t, nil, nil, nil
	}
	polls := backoff.Backoff{Initial: closedPollFirst, Max: closedPollMax}
	poll := time.NewTimer(polls.Next())
	defer poll.Stop()
	pollC := poll.C
	if p == nil {
		pollC = nil
	}
	read := time.NewTicker(recordReadEvery)
	defer read.Stop()
	for {
		select {
		case n := <-here:
			return n.turn, n.outputs, nil, nil
		case <-heard:
			if t, _, err := d.turns.get(ctx, key); err == nil && closedTurn(t) {
				return t, nil, nil, nil
			}
		case <-read.C:
			if t, _, err := d.turns.get(ctx, key); err == nil && closedTurn(t) {
				return t, nil, nil, nil
			}
			if keep != nil && !keep() {
				return nil, nil, nil, errHandedOver
			}
		case <-pollC:
			obs, err := p.Poll(ctx, ref)
			if err == nil && obs.State == ObjectFailed {
				return nil, nil, obs, nil
			}
			if err == nil && obs.State == ObjectDone {
				// Make sure it is not our own submission that finished it:
				// a turn still submitting (its submitted mark not yet
				// stored, as during a failover) or unreadable now is waited
				// for; only a turn nobody began to submit means the run
				// finished without its results.
				t, _, err := d.turns.get(ctx, key)
				switch {
				case err == nil && closedTurn(t):
					return t, nil, nil, nil
				case err == nil && t.State == TurnCollecting && t.lease.Owner == "" && t.lease.Epoch == 0:
					// Created with no lease, and nobody began to submit it:
					// the run finished without the calls' results.
					return nil, nil, &Observation{State: ObjectFailed, Reason: "the platform finished the run without the calls' results"}, nil
				case err == nil && t.lease.Free(time.Now()):
					// Its owner went, maybe after submitting it with no
					// write (docs/turns.md): the engine takes it over and
					// submits it again, which the platform, done with the
					// run, answers as already submitted.
					d.engine.Close(string(key))
				}
			}
			poll.Reset(polls.Next())
		case <-ctx.Done():
			return nil, nil, nil, ctx.Err()
		}
	}
}

// cancelTurns closes the open turns of a watch whose run the platform
// ended: nothing can be submitted any more.
func (d *Dispatcher) cancelTurns(ctx context.Context, w *Watch, reason string) {
	for _, key := range w.Turns {
		if d.cancelTurn(ctx, key, "not submitted: "+reason, reason) {
			d.log.Warn("turn cancelled: the platform ended the run", "turn", key, "reason", reason)
		}
	}
}

// cancelTurn fails a turn still collecting, with the record's error
// errMsg, and tells the executors of its calls (reason), so running
// handlers are cancelled and queued calls skip. It reports whether it
// cancelled the turn (false: it was closed already, or the record could
// not be changed). A turn another replica owns is cancelled once its
// lease lapses, if it is still collecting then (docs/turns.md).
func (d *Dispatcher) cancelTurn(ctx context.Context, key protocol.TurnKey, errMsg, reason string) bool {
	done := make(chan bool, 1)
	d.engine.Cancel(string(key), errMsg, func(ok bool) { done <- ok })
	var cancelled bool
	select {
	case cancelled = <-done:
	case <-ctx.Done():
		return false
	}
	if !cancelled {
		return false
	}
	t, _, err := d.turns.get(ctx, key)
	if err != nil {
		return true
	}
	teams := map[string]bool{}
	for _, c := range t.Calls {
		if c.published() && c.Team != protocol.SystemTeam && !teams[c.Team] {
			teams[c.Team] = true
			if _, err := d.js.Publish(ctx, protocol.CancelSubject(c.Team, key), []byte(reason),
				jetstream.WithMsgID(protocol.CancelMsgID(key, c.Team))); err != nil {
				d.log.Warn("telling executors of a cancelled turn failed", "turn", key, "team", c.Team, "err", err)
			}
		}
	}
	d.emit(Event{Kind: EventTurnFailed, Turn: t})
	return true
}

// startDriver drives w in the background unless this replica already does.
func (d *Dispatcher) startDriver(w *Watch) bool {
	d.driversMu.Lock()
	if d.drivers[w.ID] {
		d.driversMu.Unlock()
		return true
	}
	d.drivers[w.ID] = true
	d.driversMu.Unlock()
	ok := d.background(func(ctx context.Context) {
		defer func() {
			d.driversMu.Lock()
			delete(d.drivers, w.ID)
			d.driversMu.Unlock()
		}()
		switch handedOver := d.drive(ctx, w); {
		case handedOver:
			d.log.Info("another replica drives this watch now; leaving it", "watch", w.ID)
		case w.State == WatchActive: // the dispatcher is stopping
			d.releaseWatch(ctx, w)
		}
	})
	if !ok {
		d.driversMu.Lock()
		delete(d.drivers, w.ID)
		d.driversMu.Unlock()
	}
	return ok
}

// releaseWatch marks a watch whose driver stopped with the dispatcher as
// free to take, so another replica's sweep drives it at once instead of
// waiting watchStaleAfter. It changes nothing if another replica took the
// watch meanwhile (its claim saved a later UpdatedAt).
func (d *Dispatcher) releaseWatch(ctx context.Context, w *Watch) {
	e, err := d.watches.Get(ctx, w.ID)
	if err != nil {
		return
	}
	var have Watch
	if json.Unmarshal(e.Value(), &have) != nil || have.State != WatchActive || have.UpdatedAt.After(w.UpdatedAt) || (have.Driver != "" && have.Driver != d.opts.Name) {
		return
	}
	have.Released = true
	b, _ := json.Marshal(&have)
	if _, err := d.watches.Update(ctx, w.ID, b, e.Revision()); err == nil {
		d.log.Info("watch left to the other replicas", "watch", w.ID)
	}
}

// Each replica answers on its presence subject while it runs, and names
// itself in the watches it drives (Watch.Driver). Another replica can so
// tell a watch whose driver was killed (no responder, known at once) from
// one whose driver is running; before, a restarted replica took every
// active watch, and each was driven twice from then on.

// presenceSubject is where the replica named name answers while it runs.
// Names are free text (a host name has dots), so the subject carries a
// digest of it.
func presenceSubject(name string) string { return replicaSubject(name, "alive") }

// replicaSubject is the subject of one replica's (or process's) id and
// what it hears there; the id is free text, so the subject carries a
// digest of it.
func replicaSubject(id, what string) string {
	sum := sha256.Sum256([]byte(id))
	return "toolrelay.dispatcher." + hex.EncodeToString(sum[:12]) + "." + what
}

// errHandedOver ends a wait whose watch another replica took.
var errHandedOver = errors.New("dispatch: the watch is driven by another replica now")

// presenceTimeout bounds asking whether a replica is running; no answer
// in time is not taken for gone.
const presenceTimeout = 2 * time.Second

func (d *Dispatcher) servePresence() (stop func(), err error) {
	return d.hear(presenceSubject(d.opts.Name), "", func(m *nats.Msg) { _ = m.Respond(nil) })
}

// hear subscribes handle to subject on the dispatcher's connection, in
// the queue group queue if not empty, and returns once the server has the
// subscription.
func (d *Dispatcher) hear(subject, queue string, handle nats.MsgHandler) (stop func(), err error) {
	nc := d.js.Conn()
	sub, err := nc.QueueSubscribe(subject, queue, handle)
	if err != nil {
		return nil, err
	}
	if err := nc.FlushTimeout(declareTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	return func() { _ = sub.Unsubscribe() }, nil
}

// driverGone reports whether the replica named driver is certainly not
// running: nothing answers on its presence subject.
func (d *Dispatcher) driverGone(ctx context.Context, driver string) bool {
	ctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	_, err := d.js.Conn().RequestWithContext(ctx, presenceSubject(driver), nil)
	return errors.Is(err, nats.ErrNoResponders)
}

// keepWatch saves w to show that its driver is alive, unless another
// replica has taken the watch meanwhile (its claim names it, as when this
// replica was thought gone) or finished it: then it saves nothing and
// reports false, and this driver steps aside. The save is a
// compare-and-set on the record read, so a claim landing in between is
// not overwritten.
func (d *Dispatcher) keepWatch(ctx context.Context, w *Watch) bool {
	ours, _ := d.storeWatch(ctx, w)
	return ours
}

// storeWatch is keepWatch's compare-and-set, and every save of a watch
// its driver makes goes through it: ours is false when another replica
// drives or finished the watch (nothing is written then), saved whether
// w was written.
func (d *Dispatcher) storeWatch(ctx context.Context, w *Watch) (ours, saved bool) {
	for range 3 {
		e, err := d.watches.Get(ctx, w.ID)
		if err != nil {
			// Cannot read it (a reconnect): write nothing, which could
			// undo a claim made meanwhile; the next save tries again.
			return true, false
		}
		var have Watch
		if json.Unmarshal(e.Value(), &have) == nil && (have.State != WatchActive || have.Driver != "" && have.Driver != d.opts.Name) {
			return false, false // another replica drives it, or has finished it
		}
		w.UpdatedAt = time.Now().UTC()
		b, _ := json.Marshal(w)
		_, err = d.watches.Update(ctx, w.ID, b, e.Revision())
		if err == nil {
			return true, true
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			d.log.Warn("saving watch failed", "watch", w.ID, "err", err)
			return true, false
		}
		// Changed since the read: read it again.
	}
	return true, false
}

// driving reports whether this replica drives the watch.
func (d *Dispatcher) driving(id string) bool {
	d.driversMu.Lock()
	defer d.driversMu.Unlock()
	return d.drivers[id]
}

// closedTurn reports whether t is submitted or failed.
func closedTurn(t *Turn) bool { return t.State == TurnSubmitted || t.State == TurnFailed }
