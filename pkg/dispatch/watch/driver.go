package watch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A watch's driver: the loop that polls its object (and follows its event
// stream), takes each required action in, waits for the turn to close and
// moves on, and what becomes of the watch when its dispatcher stops.

// maxPollInterval is the longest a driver waits between polls of an
// object that does not change.
const maxPollInterval = 5 * time.Second

// errHandedOver ends a wait whose watch another replica took.
var errHandedOver = errors.New("watch: the watch is driven by another replica now")

// drive polls w's object and takes in each required action until the
// object is done, failed, or MaxSteps turns were driven. It is longer than
// our usual functions because it is the watch's state machine: every answer
// the platform can give, and how each ends the watch or polls again, reads
// in one place.
func (s *Service) drive(ctx context.Context, w *dispatch.Watch) (handedOver bool) {
	// Drivers stop at once on shutdown; the watch stays active in the
	// bucket and a restarted dispatcher resumes it. An intake already begun
	// runs on under background, which ends with the shutdown timeout (see
	// intakeForWatch).
	background := ctx
	ctx, stop := s.d.UntilStop(ctx)
	defer stop()
	opts := s.d.Options()
	log := s.log.With("watch", w.ID, "ref", w.Ref.String())
	p, _ := s.d.Platform(w.Ref.Platform)
	// Polls slow down while the object is unchanged, and start again at
	// PollInterval when it changes.
	polls := backoff.Backoff{Initial: opts.PollInterval, Max: maxPollInterval, Factor: 1.5}
	// wake brings the turns the event stream took in: each is listed on
	// the watch (and counted against MaxSteps) as a polled one is, even if
	// it is submitted before the next poll could see it. A nil one asks
	// for a poll now: the stream (re)opened, and what came before it is
	// not replayed.
	wake := make(chan *dispatch.TurnRequest, 1)
	var streamed *dispatch.TurnRequest
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
	if f, ok := p.(dispatch.Follower); ok {
		fctx, stopFollowing := context.WithCancel(ctx)
		var following sync.WaitGroup
		following.Go(func() { s.follow(fctx, f, w, wake, log) })
		defer func() { stopFollowing(); following.Wait() }()
	}
	finish := func(state dispatch.WatchState, answer, reason string) {
		w.State, w.Answer, w.Error = state, answer, reason
		ours, saved := s.storeWatch(ctx, w)
		retry := backoff.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
		for giveUp := time.Now().Add(s.unavailableFor); ours && !saved && time.Now().Before(giveUp); {
			if !backoff.Sleep(ctx, retry.Next()) {
				break
			}
			ours, saved = s.storeWatch(ctx, w)
		}
		switch {
		case !ours:
			log.Info("watch ended here, but another replica drives or finished it; its record stands", "state", state)
		case !saved:
			// Left active, so that stopping releases it and the next
			// driver finds the outcome again.
			w.State, w.Answer, w.Error = dispatch.WatchActive, "", ""
			log.Warn("watch ended, but its outcome could not be saved; the next driver finds it again", "state", state)
		default:
			log.Info("watch ended", "state", state, "reason", reason)
		}
	}
	lastSave := time.Now()
	for ctx.Err() == nil {
		if time.Since(lastSave) > s.saveEvery {
			if !s.keepWatch(ctx, w) { // keep UpdatedAt fresh: this watch is alive
				return true
			}
			lastSave = time.Now()
		}
		var obs *dispatch.Observation
		var err error
		polled := streamed == nil
		if !polled {
			obs, streamed = &dispatch.Observation{State: dispatch.ObjectRequiresAction, Turn: streamed}, nil
		} else {
			obs, err = p.Poll(ctx, w.Current)
		}
		if err != nil {
			var pe *dispatch.PlatformError
			if errors.As(err, &pe) && !pe.Retryable {
				finish(dispatch.WatchFailed, "", err.Error())
				return false
			}
			log.Warn("poll failed; retrying", "err", err)
			wait()
			continue
		}
		if polled && obs.State != dispatch.ObjectUnsupported {
			// What the object waits on now replaces what it waited on.
			if !s.noteUnsupported(ctx, w, obs.Unsupported, log) {
				return true
			}
		}
		switch obs.State {
		case dispatch.ObjectRunning:
			wait()
		case dispatch.ObjectUnsupported:
			if !s.noteUnsupported(ctx, w, obs.Unsupported, log) {
				return true
			}
			if !canMoveOn(w.Current) {
				finish(dispatch.WatchUnsupported, "", unsupportedReason(w.Current, obs.Unsupported))
				return false
			}
			wait() // someone else may answer it; the object then moves on
		case dispatch.ObjectDone:
			finish(dispatch.WatchCompleted, obs.Answer, "")
			return false
		case dispatch.ObjectFailed:
			s.cancelTurns(ctx, w, obs.Reason)
			finish(dispatch.WatchFailed, "", obs.Reason)
			return false
		case dispatch.ObjectRequiresAction:
			if len(w.Turns) >= opts.MaxSteps {
				finish(dispatch.WatchFailed, "", fmt.Sprintf("stopped after %d turns (the max-steps limit)", opts.MaxSteps))
				return false
			}
			if obs.Turn.Channel == "" {
				obs.Turn.Channel = "poll"
			}
			t, fresh, err := s.intakeForWatch(otelconv.Propagator.Extract(ctx, &w.Trace), background, obs.Turn, w)
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
			t, ended, err := s.awaitClosed(ctx, t.Key, w, &lastSave)
			if errors.Is(err, errHandedOver) {
				return true
			}
			if err != nil {
				return false // shutting down; the sweep picks it up
			}
			if ended != nil {
				// The platform cancelled, expired or finished the run while
				// its calls were still running: stop them.
				s.cancelTurns(ctx, w, ended.Reason)
				finish(dispatch.WatchFailed, "", ended.Reason)
				return false
			}
			if t.State == dispatch.TurnFailed {
				finish(dispatch.WatchFailed, "", "submission failed: "+t.Outcome().Error)
				return false
			}
			if next := t.Outcome().Next; next != nil {
				w.Current = *next
				s.indexResponse(ctx, w.Current.ResponseID, w.ID)
			}
			if !s.keepWatch(ctx, w) {
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

// keepAliveEvery is how often a driver waiting for a turn to close looks
// whether its watch is due a save.
const keepAliveEvery = time.Second

// awaitClosed waits for the turn key of w to close
// ([dispatch.Dispatcher.AwaitClosed]), or for the platform to end w's
// current run. A long turn keeps the watch alive meanwhile: it is saved
// every saveEvery (lastSave is when it last was), and if another replica
// took it the wait ends with errHandedOver.
func (s *Service) awaitClosed(ctx context.Context, key protocol.TurnKey, w *dispatch.Watch, lastSave *time.Time) (*dispatch.Turn, *dispatch.Observation, error) {
	run := w.Current
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var keeping sync.WaitGroup
	keeping.Go(func() {
		tick := time.NewTicker(keepAliveEvery)
		defer tick.Stop()
		for {
			select {
			case <-wctx.Done():
				return
			case <-tick.C:
			}
			// Saved under ctx, not wctx: a save under way when the turn
			// closes finishes rather than failing half-way.
			if time.Since(*lastSave) > s.saveEvery {
				if !s.keepWatch(ctx, w) {
					cancel(errHandedOver)
					return
				}
				*lastSave = time.Now()
			}
		}
	})
	t, ended, err := s.d.AwaitClosed(wctx, key, run)
	cancel(nil)
	keeping.Wait()
	if err != nil && errors.Is(context.Cause(wctx), errHandedOver) {
		return nil, nil, errHandedOver
	}
	return t, ended, err
}

// noteUnsupported records on the watch what its object waits on that
// toolrelay does not serve (items; none: nothing), and says so once per
// item ([dispatch.Dispatcher.ReportUnsupported]). It saves the watch when
// that changed, and reports false if another replica drives it now.
func (s *Service) noteUnsupported(ctx context.Context, w *dispatch.Watch, items []dispatch.UnsupportedItem, log *slog.Logger) bool {
	if slices.Equal(w.Unsupported, items) {
		return true
	}
	for _, it := range items {
		if !slices.Contains(w.Unsupported, it) {
			s.d.ReportUnsupported(ctx, w.Current, it)
		}
	}
	if len(items) == 0 {
		log.InfoContext(ctx, "the object no longer waits on anything toolrelay does not serve", "object", w.Current.String())
	}
	w.Unsupported = slices.Clone(items)
	return s.keepWatch(ctx, w)
}

// unsupportedReason is the error of a watch whose object ended on items
// toolrelay does not serve.
func unsupportedReason(ref dispatch.Ref, items []dispatch.UnsupportedItem) string {
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
func (s *Service) follow(ctx context.Context, f dispatch.Follower, w *dispatch.Watch, wake chan *dispatch.TurnRequest, log *slog.Logger) {
	tctx := otelconv.Propagator.Extract(ctx, &w.Trace)
	reconnect := backoff.Backoff{Initial: 250 * time.Millisecond, Max: 30 * time.Second}
	for ctx.Err() == nil {
		started := time.Now()
		err := f.Follow(ctx, w.Ref, &dispatch.FollowEvents{
			Open: func() {
				select {
				case wake <- nil: // a turn waiting there brings a poll too
				default:
				}
			},
			Found: func(req *dispatch.TurnRequest) {
				req.Channel = "stream"
				// Taken in at once, so its calls go out without waiting for
				// the driver; the driver then lists it on the watch.
				if _, err := s.d.Intake(tctx, req); err != nil {
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
// turn's record, which gives this replica the turn's lease, and hearing
// that it was stored never tracks the turn, so a stopping replica cannot
// release that lease, and the replica that drives the watch next waits for
// it to lapse. Finished, the turn is tracked and its lease released with
// the others at shutdown.
func (s *Service) intakeForWatch(ctx, background context.Context, req *dispatch.TurnRequest, w *dispatch.Watch) (*dispatch.Turn, bool, error) {
	key := req.Key()
	if slices.Contains(w.Turns, key) {
		// Taken in already, or by a driver that stopped mid-intake: then
		// its calls may never have gone out, and Resume sends them now
		// rather than the sweep when it finds the turn open for a while.
		t, err := s.d.Resume(ctx, key)
		if err == nil {
			return t, false, nil
		}
		if !errors.Is(err, dispatch.ErrNotFound) {
			return nil, false, err
		}
		// Listed, but the intake never happened: do it now.
	} else {
		w.Turns = append(w.Turns, key)
		switch ours, saved := s.storeWatch(ctx, w); {
		case !ours:
			return nil, false, errHandedOver
		case !saved: // the turn must be listed before it is taken in
			w.Turns = w.Turns[:len(w.Turns)-1]
			return nil, false, errors.New("watch: the watch could not be saved before its turn's intake")
		}
	}
	t, err := s.d.Intake(otelconv.Propagator.Extract(background, &w.Trace), req)
	if err != nil {
		return nil, false, err
	}
	return t, true, nil
}

// cancelTurns closes the open turns of a watch whose run the platform
// ended: nothing can be submitted any more.
func (s *Service) cancelTurns(ctx context.Context, w *dispatch.Watch, reason string) {
	for _, key := range w.Turns {
		s.d.CancelTurn(ctx, key, reason)
	}
}

// startDriver drives w in the background unless this replica already does.
func (s *Service) startDriver(w *dispatch.Watch) bool {
	s.mu.Lock()
	if s.driving[w.ID] {
		s.mu.Unlock()
		return true
	}
	s.driving[w.ID] = true
	s.mu.Unlock()
	done := func() {
		s.mu.Lock()
		delete(s.driving, w.ID)
		s.mu.Unlock()
	}
	ok := s.d.Go(func(ctx context.Context) {
		defer done()
		switch handedOver := s.drive(ctx, w); {
		case handedOver:
			s.log.Info("another replica drives this watch now; leaving it", "watch", w.ID)
		case w.State == dispatch.WatchActive: // the dispatcher is stopping
			s.releaseWatch(ctx, w)
		}
	})
	if !ok {
		done()
	}
	return ok
}

// drives reports whether this replica drives the watch id.
func (s *Service) drives(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.driving[id]
}
