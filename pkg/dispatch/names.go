package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Names. A team owns a function name by its claim in the registry bucket
// (keyed by the name) and, before that, by the name's canonical form
// (protocol.CanonicalFunctionName) in the names bucket: names that read
// alike (get_horoscope, Get_Horoscope, get-horoscope) belong to one team.
// Both are created by compare-and-set, the canonical form first, so of two
// teams racing for two confusable names on two replicas one wins. Claims
// are released when nobody has served them for a while (release.go).
//
// Claims written by a replica of an earlier version have no canonical
// entry: each replica also refuses a name whose canonical form a claim of
// another team has, and creates the missing entries as it sweeps.

// nameEntry is an entry of the names bucket as the cache has it.
type nameEntry struct {
	claim   *protocol.NameClaim
	rev     uint64
	created time.Time
}

// claimTries bounds the compare-and-set rounds of one claim.
const claimTries = 3

func (r *registry) applyName(e jetstream.KeyValueEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.notify()
	if e.Operation() != jetstream.KeyValuePut {
		delete(r.canon, e.Key())
		delete(r.lastHeld, e.Key())
		return
	}
	c, err := protocol.DecodeNameClaim(e.Value())
	if err != nil {
		r.log.Error("ignoring an invalid entry of the names bucket", "name", e.Key(), "err", err)
		return
	}
	r.canon[e.Key()] = nameEntry{claim: c, rev: e.Revision(), created: e.Created()}
}

// cacheClaim records a claim read or written by this replica before its
// watcher delivers it; r.mu is held.
func (r *registry) cacheClaim(spec *protocol.FunctionSpec, rev uint64, size int, created time.Time) {
	r.unindexClaim(spec.Name)
	r.owners[spec.Name], r.claimRevs[spec.Name] = spec, rev
	r.indexClaim(spec.Name, size, created)
}

// indexClaim adds name's claim, in r.owners, to the indexes; r.mu is held.
func (r *registry) indexClaim(name string, size int, created time.Time) {
	spec := r.owners[name]
	if spec == nil {
		return
	}
	r.owned[spec.Team]++
	r.teamBytes[spec.Team] += int64(size)
	r.claimSize[name], r.claimCreated[name] = size, created
	c := protocol.CanonicalFunctionName(name)
	if r.byCanon[c] == nil {
		r.byCanon[c] = map[string]bool{}
	}
	r.byCanon[c][name] = true
}

// unindexClaim removes name's claim, in r.owners, from the indexes; r.mu
// is held.
func (r *registry) unindexClaim(name string) {
	spec := r.owners[name]
	if spec == nil {
		return
	}
	if r.owned[spec.Team]--; r.owned[spec.Team] <= 0 {
		delete(r.owned, spec.Team)
	}
	r.teamBytes[spec.Team] -= int64(r.claimSize[name])
	if r.teamBytes[spec.Team] <= 0 {
		delete(r.teamBytes, spec.Team)
	}
	delete(r.claimSize, name)
	delete(r.claimCreated, name)
	delete(r.lastServed, name)
	c := protocol.CanonicalFunctionName(name)
	if delete(r.byCanon[c], name); len(r.byCanon[c]) == 0 {
		delete(r.byCanon, c)
	}
}

// forgetDeclaration drops the declaration under key from the cache; r.mu
// is held.
func (r *registry) forgetDeclaration(name, key string) {
	d := r.live[name][key]
	if d == nil {
		return
	}
	team := d.decl.Spec.Team
	if r.teamBytes[team] -= int64(d.size); r.teamBytes[team] <= 0 {
		delete(r.teamBytes, team)
	}
	if owner := r.owners[name]; owner != nil && owner.Team == team {
		r.lastServed[name] = time.Now() // served until now
	}
	delete(r.live[name], key)
}

// rival returns the team other than team owning name or a name that reads
// as it (the canonical form's entry, or a claim of an earlier version),
// and that name when the cache knows one; "" if none does. r.mu is held.
func (r *registry) rival(name, team string) (owner, owned string) {
	if o := r.owners[name]; o != nil {
		if o.Team != team {
			return o.Team, name
		}
		return "", ""
	}
	c := protocol.CanonicalFunctionName(name)
	for n := range r.byCanon[c] {
		if o := r.owners[n]; o.Team != team {
			return o.Team, n
		}
	}
	if e, ok := r.canon[c]; ok && e.claim.Team != team {
		return e.claim.Team, ""
	}
	return "", ""
}

// ownedBy says, for a refusal, which team owns name or one that reads as
// it.
func ownedBy(name, owner, owned, team string) string {
	if owned == name {
		return fmt.Sprintf("%s is owned by team %q; team %q cannot serve it (pick another name, or ask %q to hand it over)", name, owner, team, owner)
	}
	what := "a name that reads as it"
	if owned != "" {
		what = owned + ", which reads as it"
	}
	return fmt.Sprintf("%s reads as %s (names are compared case-folded, with '-' as '_', runs of '_' as one and outer '_' ignored) and team %q owns %s; team %q cannot serve it (pick another name, or ask %q to hand it over)",
		name, protocol.CanonicalFunctionName(name), owner, what, team, owner)
}

// claim returns the team owning spec's function and, when that is another
// team, the name it owns (the function's or one that reads as it), making
// spec's team the owner if no team is: the first team to declare a name
// owns it. With fresh (no declaration of the name by its team is live
// here) the claims are written even when they are the team's already, by
// compare-and-set, so that a replica lapsing them at that moment fails.
func (r *registry) claim(ctx context.Context, spec *protocol.FunctionSpec, fresh bool) (owner, owned string, err error) {
	r.mu.RLock()
	owner, owned = r.rival(spec.Name, spec.Team)
	r.mu.RUnlock()
	if owner != "" {
		return owner, owned, nil
	}
	c := protocol.CanonicalFunctionName(spec.Name)
	if owner, err = r.reserve(ctx, c, spec.Team, fresh); err != nil || owner != spec.Team {
		return owner, "", err
	}
	return r.claimName(ctx, spec, fresh)
}

// reserve makes team the owner of the canonical name c unless another
// team is, and returns the owner; with touch, an entry of team's is
// written again (see claim).
func (r *registry) reserve(ctx context.Context, c, team string, touch bool) (string, error) {
	r.mu.RLock()
	e, ok := r.canon[c]
	r.mu.RUnlock()
	for range claimTries {
		var err error
		switch {
		case ok && e.claim.Team != team:
			return e.claim.Team, nil
		case ok && !touch:
			return team, nil
		case ok:
			err = r.putName(ctx, c, e.claim, e.rev)
		default:
			err = r.putName(ctx, c, &protocol.NameClaim{Version: protocol.Version, Team: team, By: r.by, UpdatedAt: time.Now().UTC()}, 0)
		}
		if err == nil {
			return team, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return "", err
		}
		// Changed meanwhile: what is it now? One just written need not
		// be written again.
		if e, ok, err = r.readName(ctx, c); err != nil {
			return "", err
		}
		touch = false
	}
	return "", fmt.Errorf("dispatch: claim the name %s: it kept changing; try again", c)
}

// putName writes the canonical name c's entry: created if rev is 0, else
// updated at rev. The cache has it at once.
func (r *registry) putName(ctx context.Context, c string, nc *protocol.NameClaim, rev uint64) error {
	data, err := protocol.EncodeNameClaim(nc)
	if err != nil {
		return err
	}
	if rev == 0 {
		rev, err = r.names.Create(ctx, c, data)
	} else {
		rev, err = r.names.Update(ctx, c, data, rev)
	}
	if err != nil {
		return fmt.Errorf("dispatch: claim the name %s: %w", c, err)
	}
	r.mu.Lock()
	if cur, ok := r.canon[c]; !ok || cur.rev < rev {
		r.canon[c] = nameEntry{claim: nc, rev: rev, created: time.Now()}
	}
	r.mu.Unlock()
	return nil
}

// readName reads the canonical name c's entry from the bucket.
func (r *registry) readName(ctx context.Context, c string) (nameEntry, bool, error) {
	got, err := r.names.Get(ctx, c)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nameEntry{}, false, nil
	}
	if err != nil {
		return nameEntry{}, false, fmt.Errorf("dispatch: read the name %s: %w", c, err)
	}
	nc, err := protocol.DecodeNameClaim(got.Value())
	if err != nil {
		return nameEntry{}, false, err
	}
	return nameEntry{claim: nc, rev: got.Revision(), created: got.Created()}, true, nil
}

// claimName is claim for the name itself, once its canonical form is
// spec's team's.
func (r *registry) claimName(ctx context.Context, spec *protocol.FunctionSpec, fresh bool) (owner, owned string, err error) {
	r.mu.RLock()
	cur, rev := r.owners[spec.Name], r.claimRevs[spec.Name]
	r.mu.RUnlock()
	for range claimTries {
		switch {
		case cur != nil && cur.Team != spec.Team:
			return cur.Team, spec.Name, nil
		case cur != nil && !fresh:
			return spec.Team, "", nil
		case cur != nil:
			err = r.touchClaim(ctx, spec.Name, rev)
		default:
			var data []byte
			if data, err = protocol.EncodeFunctionSpec(spec); err != nil {
				return "", "", err
			}
			var created uint64
			if created, err = r.claims.Create(ctx, spec.Name, data); err == nil {
				r.log.InfoContext(ctx, "function claimed", "fn", spec.Name, "team", spec.Team)
				r.mu.Lock()
				if r.owners[spec.Name] == nil {
					r.cacheClaim(spec, created, len(data), time.Now())
				}
				r.mu.Unlock()
			}
		}
		if err == nil {
			return spec.Team, "", nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return "", "", fmt.Errorf("dispatch: claim %s: %w", spec.Name, err)
		}
		// Changed meanwhile: decide again on what it is now. One just
		// written need not be written again.
		if cur, rev, err = r.readClaim(ctx, spec.Name); err != nil {
			return "", "", err
		}
		fresh = false
	}
	return "", "", fmt.Errorf("dispatch: claim %s: it kept changing; try again", spec.Name)
}

// touchClaim writes name's claim again as it is, if it is still at rev.
func (r *registry) touchClaim(ctx context.Context, name string, rev uint64) error {
	e, err := r.claims.Get(ctx, name)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return jetstream.ErrKeyRevisionMismatch
	case err != nil:
		return err
	case e.Revision() != rev:
		return jetstream.ErrKeyRevisionMismatch
	}
	_, err = r.claims.Update(ctx, name, e.Value(), rev)
	return err
}

// readClaim reads name's claim from the bucket into the cache; nil if
// there is none.
func (r *registry) readClaim(ctx context.Context, name string) (*protocol.FunctionSpec, uint64, error) {
	e, err := r.claims.Get(ctx, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("dispatch: read the claim of %s: %w", name, err)
	}
	spec, err := protocol.DecodeFunctionSpec(e.Value())
	if err != nil {
		return nil, 0, err
	}
	r.mu.Lock()
	if r.claimRevs[name] < e.Revision() {
		r.cacheClaim(spec, e.Revision(), len(e.Value()), e.Created())
	}
	r.mu.Unlock()
	return spec, e.Revision(), nil
}

// standing is what declare needs to know of a declaration before it
// claims anything.
type standing struct {
	// owner is another team owning the name, or one that reads as it
	// (owned, when the cache knows which).
	owner, owned string
	owns         bool  // the name's claim is the declaring team's
	known        bool  // the declaration is live: this renews it
	served       bool  // a declaration of the name by its team is live
	names        int   // the names the team owns
	bytes        int64 // the team's declarations and claims, encoded
	size         int   // the declaration's bytes in the registry now
}

func (r *registry) standing(decl *protocol.Declaration) standing {
	name, team := decl.Spec.Name, decl.Spec.Team
	r.mu.RLock()
	defer r.mu.RUnlock()
	var s standing
	s.owner, s.owned = r.rival(name, team)
	o := r.owners[name]
	s.owns = o != nil && o.Team == team
	if d, ok := r.live[name][decl.Key()]; ok {
		s.known, s.size = true, d.size
	}
	s.served = len(r.liveOf(name, team)) > 0
	s.names, s.bytes = r.owned[team], r.teamBytes[team]
	return s
}

// renews reports whether req only renews declarations live already.
func (r *registry) renews(req *protocol.DeclareRequest) bool {
	if req.Op != protocol.DeclareServe {
		return false
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	for i := range req.Declarations {
		d := &req.Declarations[i]
		if _, ok := r.live[d.Spec.Name][d.Key()]; !ok {
			return false
		}
	}
	return true
}
