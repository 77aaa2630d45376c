package dispatch

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Claims are released when nobody serves them. A team keeps a name while
// an executor of it serves the name, and for Options.ClaimGrace after the
// last one stops; then any replica purges the claim, by compare-and-set on
// the revision it read, so that a claim written again meanwhile (an
// executor starting: claim writes it again when none of the team's is
// live) is not lost. Purging drops the claim's history with it.
//
// Each replica counts from what it has seen itself: a name is served until
// this replica started, until it last saw a live declaration of it, and
// until its claim was last written, whichever is latest. A replica that has
// just started releases nothing for a grace; one that misses a renewal
// (its cache behind) releases nothing that is served, since renewals
// arrive every few seconds and the grace is long. Replicas of earlier
// versions release nothing and do not write claims again: beside them, a
// name released in the instant its executor starts is claimed again by
// that executor's next renewal, unless another team takes it first.
//
// A canonical name's entry (names.go) is released once no claim of its
// team has that form, after min(ClaimGrace, releaseNameAfter), unless an
// operator reserved it (ReserveName).

// releaseNameAfter bounds how long a canonical name's entry outlives the
// last claim of its form.
const releaseNameAfter = time.Minute

// releaseEvery releases the claims nobody serves, every quarter of grace
// (at most a minute), until ctx ends.
func (r *registry) releaseEvery(ctx context.Context, grace time.Duration) {
	tick := time.NewTicker(min(max(grace/4, 50*time.Millisecond), time.Minute))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if r.loaded.Load() {
			r.releaseUnserved(ctx, grace)
		}
	}
}

// unserved is a claim or a canonical name's entry to release, at rev.
type unserved struct {
	key, team string
	rev       uint64
}

// releaseUnserved releases what nobody has served for grace, and creates
// the canonical names' entries missing for claims of earlier versions.
func (r *registry) releaseUnserved(ctx context.Context, grace time.Duration) {
	now := time.Now()
	var claims, names, missing []unserved
	r.mu.Lock()
	for name, spec := range r.owners {
		if len(r.liveOf(name, spec.Team)) > 0 {
			r.lastServed[name] = now
			continue
		}
		if now.Sub(latest(r.lastServed[name], r.started, r.claimCreated[name])) >= grace {
			claims = append(claims, unserved{key: name, team: spec.Team, rev: r.claimRevs[name]})
		}
	}
	for c := range r.byCanon {
		if _, ok := r.canon[c]; !ok {
			for name := range r.byCanon[c] {
				missing = append(missing, unserved{key: c, team: r.owners[name].Team})
				break
			}
		}
	}
	for c, e := range r.canon {
		if e.claim.Reserved {
			continue
		}
		if r.holds(c, e.claim.Team) {
			r.lastHeld[c] = now
			continue
		}
		if now.Sub(latest(r.lastHeld[c], r.started, e.created)) >= min(grace, releaseNameAfter) {
			names = append(names, unserved{key: c, team: e.claim.Team, rev: e.rev})
		}
	}
	r.mu.Unlock()

	for _, u := range claims {
		err := r.claims.Purge(ctx, u.key, jetstream.LastRevision(u.rev))
		r.released(ctx, "function", u, grace, err)
	}
	for _, u := range names {
		err := r.names.Purge(ctx, u.key, jetstream.LastRevision(u.rev))
		r.released(ctx, "canonical name", u, grace, err)
	}
	for _, u := range missing {
		data, err := protocol.EncodeNameClaim(&protocol.NameClaim{Version: protocol.Version, Team: u.team, By: r.by, UpdatedAt: now.UTC()})
		if err == nil {
			_, err = r.names.Create(ctx, u.key, data)
		}
		if err != nil && !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			r.log.WarnContext(ctx, "could not record the owner of a canonical name", "name", u.key, "team", u.team, "err", err)
		}
	}
}

// released logs the release of what u is.
func (r *registry) released(ctx context.Context, what string, u unserved, grace time.Duration, err error) {
	switch {
	case err == nil:
		r.log.InfoContext(ctx, "released a "+what+" nobody serves", "name", u.key, "team", u.team, "grace", grace.String())
	case errors.Is(err, jetstream.ErrKeyRevisionMismatch):
		// Written again meanwhile (served again), or released by
		// another replica.
	case ctx.Err() == nil:
		r.log.WarnContext(ctx, "could not release a "+what+" nobody serves; trying again later", "name", u.key, "team", u.team, "err", err)
	}
}

// holds reports whether a claim of team has the canonical name c; r.mu is
// held.
func (r *registry) holds(c, team string) bool {
	for name := range r.byCanon[c] {
		if r.owners[name].Team == team {
			return true
		}
	}
	return false
}

func latest(ts ...time.Time) time.Time {
	var t time.Time
	for _, u := range ts {
		if u.After(t) {
			t = u
		}
	}
	return t
}
