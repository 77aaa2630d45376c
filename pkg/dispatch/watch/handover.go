package watch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// Who drives a watch: each driver saves its watch every saveEvery, naming
// its replica; a replica that stops releases the watches it drove; each
// replica answers on its presence subject while it runs. Another replica's
// sweep takes a watch that was released, whose driver went silent, or
// whose replica does not answer (killed), by compare-and-set.
const (
	// staleAfter is how long a driver may stay silent (drivers save every
	// saveEvery) before another replica drives its watch.
	staleAfter = time.Minute
	// saveEvery is how often a driver saves its watch to show it is
	// alive.
	saveEvery = 20 * time.Second
	// presenceGrace is how long past its save period a watch's driver
	// must have been silent before a missing presence answer counts: a
	// healthy driver saves at the first poll after the period, which may
	// wait maxPollInterval and take a while itself.
	presenceGrace = maxPollInterval + 10*time.Second
	// presenceTimeout bounds asking whether a replica is running; no
	// answer in time is not taken for gone.
	presenceTimeout = 2 * time.Second
	// subscribeTimeout bounds the wait for the server to have a
	// subscription.
	subscribeTimeout = 5 * time.Second
)

// Serve binds the buckets Run provisioned, answers on this replica's
// presence subject and serves the watch API on NATS, until stop is called
// (Run calls it when it stops).
func (s *Service) Serve(ctx context.Context) (stop func(), err error) {
	if err := s.bind(ctx); err != nil {
		return nil, err
	}
	nc := s.js.Conn()
	presence, err := nc.Subscribe(presenceSubject(s.name), func(m *nats.Msg) { _ = m.Respond(nil) })
	if err != nil {
		return nil, err
	}
	if err := nc.FlushTimeout(subscribeTimeout); err != nil {
		_ = presence.Unsubscribe()
		return nil, err
	}
	stopNATS, err := s.serveNATS(ctx)
	if err != nil {
		_ = presence.Unsubscribe()
		return nil, err
	}
	return func() { stopNATS(); _ = presence.Unsubscribe() }, nil
}

// presenceSubject is where the replica named name answers while it runs.
// Names are free text (a host name has dots), so the subject carries a
// digest of it.
func presenceSubject(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "toolrelay.dispatcher." + hex.EncodeToString(sum[:12]) + ".alive"
}

// driverGone reports whether the replica named driver is certainly not
// running: nothing answers on its presence subject.
func (s *Service) driverGone(ctx context.Context, driver string) bool {
	ctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	_, err := s.js.Conn().RequestWithContext(ctx, presenceSubject(driver), nil)
	return errors.Is(err, nats.ErrNoResponders)
}

// Sweep drives the active watches whose driver stopped with its
// dispatcher (released), went silent for a minute, or is not running
// (killed: nothing answers on its presence subject), claiming each by
// compare-and-set so that one replica drives it. At startup it also takes
// the watches this replica's name drove before it restarted. Run calls it
// after each sweep of the turns.
func (s *Service) Sweep(ctx context.Context, startup bool) {
	b := s.buckets.Load()
	if b == nil {
		return
	}
	keys, err := b.watches.ListKeys(ctx)
	if err != nil {
		return
	}
	gone := map[string]bool{} // per driver, asked once a sweep
	driverGone := func(name string) bool {
		g, ok := gone[name]
		if !ok {
			g = s.driverGone(ctx, name)
			gone[name] = g
		}
		return g
	}
	for k := range keys.Keys() {
		e, err := b.watches.Get(ctx, k)
		if err != nil {
			continue
		}
		var w dispatch.Watch
		if json.Unmarshal(e.Value(), &w) != nil || w.State != dispatch.WatchActive {
			continue
		}
		switch {
		case s.drives(w.ID):
			continue
		case w.Released || time.Since(w.UpdatedAt) >= staleAfter:
			// left by its driver, or its driver went silent
		case w.Driver == "":
			if !startup {
				continue
			}
			// Written by a version that does not name its driver: a
			// restart takes it, as that version did.
		case w.Driver == s.name:
			if !startup {
				continue // another process of the same name drives it
			}
			// This replica's before it restarted under the same name.
		case !startup && time.Since(w.UpdatedAt) < s.saveEvery+presenceGrace, !driverGone(w.Driver):
			// Its driver is running, or saved it lately: a running replica
			// whose connection is being re-established has no responder
			// for a moment, so later sweeps take only a driver that also
			// missed a save for gone. A replica that starts takes the
			// watches of its killed predecessor at once.
			continue
		}
		// Claim it by compare-and-set so one replica revives it.
		w.UpdatedAt, w.Released, w.Driver = time.Now().UTC(), false, s.name
		buf, _ := json.Marshal(&w)
		if _, err := b.watches.Update(ctx, k, buf, e.Revision()); err != nil {
			continue
		}
		s.log.Info("sweep: driving a watch whose driver stopped", "watch", w.ID)
		s.startDriver(&w)
	}
}

// releaseWatch marks a watch whose driver stopped with the dispatcher as
// free to take, so another replica's sweep drives it at once instead of
// waiting staleAfter. It changes nothing if another replica took the
// watch meanwhile (its claim saved a later UpdatedAt).
func (s *Service) releaseWatch(ctx context.Context, w *dispatch.Watch) {
	b := s.buckets.Load()
	e, err := b.watches.Get(ctx, w.ID)
	if err != nil {
		return
	}
	var have dispatch.Watch
	if json.Unmarshal(e.Value(), &have) != nil || have.State != dispatch.WatchActive || have.UpdatedAt.After(w.UpdatedAt) || (have.Driver != "" && have.Driver != s.name) {
		return
	}
	have.Released = true
	buf, _ := json.Marshal(&have)
	if _, err := b.watches.Update(ctx, w.ID, buf, e.Revision()); err == nil {
		s.log.Info("watch left to the other replicas", "watch", w.ID)
	}
}

// keepWatch saves w to show that its driver is alive, unless another
// replica has taken the watch meanwhile (its claim names it, as when this
// replica was thought gone) or finished it: then it saves nothing and
// reports false, and this driver steps aside. The save is a
// compare-and-set on the record read, so a claim landing in between is
// not overwritten.
func (s *Service) keepWatch(ctx context.Context, w *dispatch.Watch) bool {
	ours, _ := s.storeWatch(ctx, w)
	return ours
}

// storeWatch is keepWatch's compare-and-set, and every save of a watch
// its driver makes goes through it: ours is false when another replica
// drives or finished the watch (nothing is written then), saved whether
// w was written.
func (s *Service) storeWatch(ctx context.Context, w *dispatch.Watch) (ours, saved bool) {
	b := s.buckets.Load()
	for range 3 {
		e, err := b.watches.Get(ctx, w.ID)
		if err != nil {
			// Cannot read it (a reconnect): write nothing, which could
			// undo a claim made meanwhile; the next save tries again.
			return true, false
		}
		var have dispatch.Watch
		if json.Unmarshal(e.Value(), &have) == nil && (have.State != dispatch.WatchActive || have.Driver != "" && have.Driver != s.name) {
			return false, false // another replica drives it, or has finished it
		}
		w.UpdatedAt = time.Now().UTC()
		buf, _ := json.Marshal(w)
		_, err = b.watches.Update(ctx, w.ID, buf, e.Revision())
		if err == nil {
			return true, true
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			s.log.Warn("saving watch failed", "watch", w.ID, "err", err)
			return true, false
		}
		// Changed since the read: read it again.
	}
	return true, false
}
