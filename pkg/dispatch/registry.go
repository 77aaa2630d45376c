package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/backoff"
	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/approval"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// registry is the dispatcher's view of the fleet: which team owns each
// function (its claim in the registry bucket) and which executor processes
// serve it now (their declarations, each lapsing unless renewed). A cache
// kept current by following the buckets, with each distinct schema
// compiled once.
//
// Validation rule: a call's arguments are valid if they match the schema
// of any live declaration of the function, so that during a rolling deploy
// from one schema to another neither the calls the old version accepts
// nor those the new one accepts are refused before they reach an executor.
// When none matches, the model is told what the newest declaration (the
// latest process to start) expects. A declaration counts only while its
// lease is current and only if it is of the owning team; a dead process's
// schema never counts.
type registry struct {
	claims jetstream.KeyValue
	decls  jetstream.KeyValue
	names  jetstream.KeyValue // owners by canonical name (names.go)
	log    *slog.Logger
	// by names this replica in the entries it writes.
	by string

	mu     sync.RWMutex
	owners map[string]*protocol.FunctionSpec
	// claimRevs are the owners' revisions in the bucket, and changes when
	// each function's definition last changed (definitions.go).
	claimRevs map[string]uint64
	changes   map[string]definitionChange
	live      map[string]map[string]*declared // function → declaration key → declaration
	schemas   map[string]*schema.Schema       // function/digest → compiled
	// disagree holds the functions whose live declarations have more than
	// one schema, as reported.
	disagree map[string]int
	// refusals are the declarations refused lately, by team/function.
	refusals map[string]refusal
	// lapsed holds, by team/function, when a lease of the function last
	// lapsed (the server removed it unrenewed) while none of its
	// declarations is live: see lapsedLately.
	lapsed  map[string]time.Time
	changed chan struct{} // closed and replaced on every change
	// The indexes of names.go and release.go, kept with owners and live:
	// the canonical names' owners and their revisions, the exact names
	// of each canonical one, each claim's size and when its revision was
	// written, the claims and registry bytes of each team, and when this
	// replica last saw each name served and each canonical name held.
	canon        map[string]nameEntry
	byCanon      map[string]map[string]bool
	claimSize    map[string]int
	claimCreated map[string]time.Time
	owned        map[string]int
	teamBytes    map[string]int64
	lastServed   map[string]time.Time
	lastHeld     map[string]time.Time
	// started is when this replica started watching: it has not seen
	// what was served before, so it counts every name served until then.
	started time.Time
	// declSeen is the latest revision of the declaration bucket the
	// watcher delivered.
	declSeen uint64
	// loaded is set once both buckets' contents are in the cache: before,
	// a function missing from it may well be served.
	loaded atomic.Bool
}

// refusal is a declaration the dispatcher refused, as reported.
type refusal struct {
	team, function, reason string
	at                     time.Time
}

// refusalQuiet is how long a refusal is not logged again.
const refusalQuiet = time.Minute

// declared is a live declaration.
type declared struct {
	decl   *protocol.Declaration
	schema *schema.Schema
	// policy is the declaration's approval policy compiled; nil for the
	// many functions without one.
	policy *approval.Policy
	digest string
	size   int // encoded, in the bucket
	// sum is the encoded declaration's SHA-256: a renewal that writes the
	// same bytes again only extends the lease (renewed).
	sum [sha256.Size]byte
	// expires is when the lease lapses unless renewed, by this process's
	// clock from when the declaration arrived: a backstop for the server's
	// removal marker, which a watcher can miss across a reconnect.
	expires time.Time
}

// function is what intake needs of a function: its owning team and its
// live declarations, newest first.
type function struct {
	name string
	team string
	live []*declared
}

func newRegistry(log *slog.Logger) *registry {
	return &registry{log: log, owners: map[string]*protocol.FunctionSpec{}, claimRevs: map[string]uint64{},
		changes: map[string]definitionChange{}, live: map[string]map[string]*declared{},
		schemas: map[string]*schema.Schema{}, disagree: map[string]int{}, refusals: map[string]refusal{},
		lapsed: map[string]time.Time{}, changed: make(chan struct{}),
		canon: map[string]nameEntry{}, byCanon: map[string]map[string]bool{}, claimSize: map[string]int{},
		claimCreated: map[string]time.Time{}, owned: map[string]int{}, teamBytes: map[string]int64{},
		lastServed: map[string]time.Time{}, lastHeld: map[string]time.Time{}, started: time.Now()}
}

// follow keeps the cache current until ctx ends. ready is closed once the
// buckets' current contents are loaded.
func (r *registry) follow(ctx context.Context, ready chan<- struct{}) {
	var loaded sync.WaitGroup
	loaded.Add(3)
	var wg sync.WaitGroup
	// The claims' history too, so that a replica starting knows when each
	// definition last changed.
	wg.Go(func() { followBucket(ctx, r.claims, r.applyClaim, loaded.Done, r.log, jetstream.IncludeHistory()) })
	wg.Go(func() { followBucket(ctx, r.decls, r.applyDeclaration, loaded.Done, r.log) })
	wg.Go(func() { followBucket(ctx, r.names, r.applyName, loaded.Done, r.log) })
	wg.Go(func() {
		loaded.Wait()
		r.loaded.Store(ctx.Err() == nil)
		close(ready)
	})
	wg.Wait()
}

// followBucket applies every change of kv until ctx ends, re-creating its
// KV watcher when it closes (for instance after a reconnect). loaded is called
// once, when the first snapshot is delivered (or ctx ends before).
func followBucket(ctx context.Context, kv jetstream.KeyValue, apply func(jetstream.KeyValueEntry), loaded func(), log *slog.Logger, opts ...jetstream.WatchOpt) {
	var once sync.Once
	defer once.Do(loaded)
	for ctx.Err() == nil {
		w, err := kv.WatchAll(ctx, opts...)
		if err != nil {
			log.Warn("following a registry bucket failed; retrying", "bucket", kv.Bucket(), "err", err)
			backoff.Sleep(ctx, time.Second)
			continue
		}
		for e := range w.Updates() {
			if e == nil {
				once.Do(loaded)
				continue
			}
			apply(e)
		}
		_ = w.Stop()
	}
}

func (r *registry) applyClaim(e jetstream.KeyValueEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	defer r.notify()
	if e.Operation() != jetstream.KeyValuePut {
		r.unindexClaim(e.Key())
		delete(r.owners, e.Key())
		delete(r.claimRevs, e.Key())
		delete(r.changes, e.Key())
		return
	}
	spec, err := protocol.DecodeFunctionSpec(e.Value())
	if err != nil || spec.Name != e.Key() {
		r.log.Error("ignoring invalid registry entry", "fn", e.Key(), "err", err)
		return
	}
	r.unindexClaim(e.Key())
	r.noteClaim(spec, e)
	r.indexClaim(e.Key(), len(e.Value()), e.Created())
}

func (r *registry) applyDeclaration(e jetstream.KeyValueEntry) {
	team, name, instance, err := protocol.ParseDeclarationKey(e.Key())
	if err != nil {
		r.log.Error("ignoring a declaration under a malformed key", "key", e.Key(), "err", err)
		return
	}
	if e.Operation() != jetstream.KeyValuePut {
		r.mu.Lock()
		r.declSeen = max(r.declSeen, e.Revision())
		// A withdrawal is a delete; the server's marker for a lease
		// that lapsed unrenewed reads as a purge.
		if e.Operation() == jetstream.KeyValuePurge {
			r.lapsed[team+"/"+name] = e.Created()
		}
		r.forgetDeclaration(name, e.Key())
		r.checkAgreement(name)
		r.notify()
		r.mu.Unlock()
		return
	}
	sum := sha256.Sum256(e.Value())
	if r.renewed(e.Key(), name, sum, e.Revision(), false) {
		return
	}
	decl, err := protocol.DecodeDeclaration(e.Value())
	if err == nil && (decl.Spec.Team != team || decl.Spec.Name != name || decl.Instance != instance) {
		err = errors.New("declaration does not match its key")
	}
	if err != nil {
		r.log.Error("ignoring invalid declaration", "key", e.Key(), "err", err)
		r.sawDeclaration(e.Revision())
		return
	}
	r.putDeclared(e.Key(), decl, e.Value(), sum, e.Revision(), false)
}

// sawDeclaration notes that the watcher delivered the declarations'
// revision rev: an early put of it or before is not needed any more. It is
// noted with what the revision changed in the cache, never before: a
// replica's next declaration must not find its bytes in neither.
func (r *registry) sawDeclaration(rev uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.declSeen = max(r.declSeen, rev)
}

// putDeclared adds a declaration stored at rev, encoded as value, to the
// cache (or renews it there): from the watcher, or early, from the replica that stored it, so
// that the team's next declarations count it at once. Early, it is added
// only if the watcher has not delivered rev yet (it delivers the
// declaration's later removal, then).
func (r *registry) putDeclared(key string, decl *protocol.Declaration, value []byte, sum [sha256.Size]byte, rev uint64, early bool) {
	name, team := decl.Spec.Name, decl.Spec.Team
	size := len(value)
	if r.renewed(key, name, sum, rev, early) {
		return
	}
	// Dispatchers store only declarations within the tool text bounds;
	// one that is not (written by an older dispatcher) is not served. The
	// schema's strings are checked once per schema, with its compilation.
	ignore := func(why string, err error) {
		r.log.Error(why, "key", key, "err", err)
		if !early {
			r.sawDeclaration(rev)
		}
	}
	if err := protocol.ValidateToolText(name, decl.Spec.Description, nil); err != nil {
		ignore("ignoring a declaration whose tool text breaks a bound", err)
		return
	}
	s, err := r.compiled(&decl.Spec)
	if err == nil && len(decl.Spec.OutputSchema) > 0 {
		_, err = r.compiledOutput(&decl.Spec, true)
	}
	var policy *approval.Policy
	if err == nil && decl.Spec.Approval != nil {
		policy, err = approval.Compile(name, team, decl.Spec.Approval)
	}
	if err != nil {
		ignore("ignoring a declaration whose schema does not compile or breaks a tool text bound", err)
		return
	}
	digest := s.Digest()
	r.mu.Lock()
	defer r.mu.Unlock()
	if early && rev <= r.declSeen {
		return
	}
	if !early {
		r.declSeen = max(r.declSeen, rev)
	}
	r.schemas[name+"/"+digest] = s
	if r.live[name] == nil {
		r.live[name] = map[string]*declared{}
	}
	delete(r.lapsed, team+"/"+name)
	r.forgetDeclaration(name, key)
	r.teamBytes[team] += int64(size)
	r.live[name][key] = &declared{decl: decl, schema: s, policy: policy, digest: digest, size: size, sum: sum, expires: time.Now().Add(protocol.LeaseTTL)}
	r.checkAgreement(name)
	r.notify()
}

// renewed extends the lease of the declaration under key, of function
// name, if the cache holds it with the same bytes (sum), and reports
// whether it did. Executors renew by sending the same declarations every
// protocol.LeaseRenewal: checked, compiled and cached when they were first
// stored, they need not be again, here or in any replica's watcher.
func (r *registry) renewed(key, name string, sum [sha256.Size]byte, rev uint64, early bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	d := r.live[name][key]
	if d == nil || d.sum != sum {
		return false
	}
	if early && rev <= r.declSeen {
		return true
	}
	if !early {
		r.declSeen = max(r.declSeen, rev)
	}
	delete(r.lapsed, d.decl.Spec.Team+"/"+name)
	d.expires = time.Now().Add(protocol.LeaseTTL)
	return true
}

// unchanged reports whether the cache holds the declaration under key,
// of function name, with the same bytes (their SHA-256, sum).
func (r *registry) unchanged(key, name string, sum [sha256.Size]byte) bool {
	r.mu.RLock()
	d := r.live[name][key]
	r.mu.RUnlock()
	return d != nil && d.sum == sum
}

// compiled returns spec's schema compiled, from r.schemas if it is there.
// It compiles without r.mu held: however long a schema takes (see
// schema.CompileTimeout), calls and other declarations do not wait for it.
func (r *registry) compiled(spec *protocol.FunctionSpec) (*schema.Schema, error) {
	if spec.Approval != nil { // compiled (and cached) by package approval
		if _, err := approval.Compile(spec.Name, spec.Team, spec.Approval); err != nil {
			return nil, err
		}
	}
	if spec.Format != nil {
		return compileFormat(spec)
	}
	if len(spec.Parameters) <= schema.MaxSize { // a larger one is refused unread
		r.mu.RLock()
		s := r.schemas[spec.Name+"/"+schema.Digest(spec.Parameters)]
		r.mu.RUnlock()
		if s != nil {
			if len(spec.OutputSchema) > 0 {
				if _, err := r.compiledOutput(spec, false); err != nil {
					return nil, err
				}
			}
			return s, nil
		}
	}
	s, err := schema.Compile(spec.Name, spec.Parameters) // its bounds before anything else reads it
	if err == nil && len(spec.OutputSchema) > 0 {
		_, err = r.compiledOutput(spec, false)
	}
	if err == nil {
		err = spec.ValidateToolText()
	}
	return s, err
}

// compiledOutput returns spec's output schema compiled, from r.schemas
// if it is there (keyed apart from parameters schemas), and with keep
// leaves it there: only putDeclared keeps, for a declaration served, whose
// schemas go with its function's last declaration, so a refused
// declaration leaves nothing behind.
func (r *registry) compiledOutput(spec *protocol.FunctionSpec, keep bool) (*schema.Schema, error) {
	key := ""
	if len(spec.OutputSchema) <= schema.MaxSize {
		key = spec.Name + "/output/" + schema.Digest(spec.OutputSchema)
		r.mu.RLock()
		s := r.schemas[key]
		r.mu.RUnlock()
		if s != nil {
			return s, nil
		}
	}
	s, err := schema.Compile(spec.Name, spec.OutputSchema)
	if err != nil {
		return nil, fmt.Errorf("output %w", err) // "output schema of <name>: ..."
	}
	if keep && key != "" {
		r.mu.Lock()
		r.schemas[key] = s
		r.mu.Unlock()
	}
	return s, nil
}

// checkAgreement reports a function whose live declarations disagree on
// its schema, once when it starts and once when it ends; r.mu is held.
func (r *registry) checkAgreement(name string) {
	digests := map[string][]string{}
	for _, d := range r.live[name] {
		digests[d.digest] = append(digests[d.digest], d.decl.Executor+"/"+d.decl.Instance)
	}
	n, was := len(digests), r.disagree[name]
	switch {
	case n > 1 && n != was:
		r.disagree[name] = n
		r.log.Warn("live executors declare different schemas for one function; arguments are accepted if any of them matches, and the newest explains a mismatch",
			"fn", name, "schemas", n, "executors", digests)
	case n <= 1 && was > 1:
		delete(r.disagree, name)
		r.log.Info("live executors agree on the function's schema again", "fn", name)
	}
	if len(r.live[name]) == 0 {
		delete(r.live, name)
		for k := range r.schemas { // drop the function's compiled schemas
			if len(k) > len(name) && k[:len(name)+1] == name+"/" {
				delete(r.schemas, k)
			}
		}
	}
}

// notify wakes whoever waits for a change; r.mu is held.
func (r *registry) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// declarationsOf counts team's live declarations other than those in
// also (which a request renews).
func (r *registry) declarationsOf(team string, also []protocol.Declaration) int {
	renewed := make(map[string]bool, len(also))
	for i := range also {
		renewed[also[i].Key()] = true
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	n := 0
	for _, byKey := range r.live {
		for key, d := range byKey {
			if d.decl.Spec.Team == team && !renewed[key] {
				n++
			}
		}
	}
	return n
}

// noteRefusal records a refused declaration and reports whether it is
// news (not refused for the same reason within refusalQuiet).
func (r *registry) noteRefusal(decl *protocol.Declaration, reason string) bool {
	key := decl.Spec.Team + "/" + decl.Spec.Name
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	last, seen := r.refusals[key]
	r.refusals[key] = refusal{team: decl.Spec.Team, function: decl.Spec.Name, reason: reason, at: now}
	return !seen || last.reason != reason || now.Sub(last.at) > refusalQuiet
}

// lookup returns the function, or nil if no team owns the name. The claim
// is read from the bucket when the cache has not seen it yet (an executor
// that announced it a moment ago).
func (r *registry) lookup(ctx context.Context, name string) (*function, error) {
	r.mu.RLock()
	owner := r.owners[name]
	r.mu.RUnlock()
	if owner == nil {
		e, err := r.claims.Get(ctx, name)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("dispatch: registry lookup %s: %w", name, err)
		}
		if owner, err = protocol.DecodeFunctionSpec(e.Value()); err != nil {
			return nil, err
		}
		r.mu.Lock()
		if r.owners[name] == nil {
			r.cacheClaim(owner, e.Revision(), len(e.Value()), e.Created())
		}
		r.mu.Unlock()
	}
	r.mu.RLock()
	defer r.mu.RUnlock()
	return &function{name: name, team: owner.Team, live: r.liveOf(name, owner.Team)}, nil
}

// liveOf returns the live declarations of name by team, newest first;
// r.mu is held.
func (r *registry) liveOf(name, team string) []*declared {
	now := time.Now()
	var live []*declared
	for _, d := range r.live[name] {
		if d.decl.Spec.Team == team && now.Before(d.expires) {
			live = append(live, d)
		}
	}
	slices.SortFunc(live, func(a, b *declared) int { return b.decl.StartedAt.Compare(a.decl.StartedAt) })
	return live
}

// awaitLive returns the function once it has a live declaration, waiting
// up to grace for one (an executor starting or reconnecting); a function
// still without one is returned as it is.
func (r *registry) awaitLive(ctx context.Context, f *function, grace time.Duration) *function {
	if len(f.live) > 0 {
		return f
	}
	deadline := time.NewTimer(grace)
	defer deadline.Stop()
	for {
		r.mu.RLock()
		changed := r.changed
		f = &function{name: f.name, team: f.team, live: r.liveOf(f.name, f.team)}
		r.mu.RUnlock()
		if len(f.live) > 0 {
			return f
		}
		select {
		case <-changed:
		case <-deadline.C:
			return f
		case <-ctx.Done():
			return f
		}
	}
}

// lapsedLately reports whether a lease of name by team lapsed within the
// last LeaseTTL, unrenewed rather than withdrawn: removed by the server, or
// past its expiry here with no renewal heard. Its process is likelier cut
// off for a moment (a server failing over holds renewals back for as long
// as an election takes) than gone, so intake waits longer for it.
func (r *registry) lapsedLately(name, team string) bool {
	r.mu.RLock()
	defer r.mu.RUnlock()
	now := time.Now()
	if at, ok := r.lapsed[team+"/"+name]; ok && now.Sub(at) < protocol.LeaseTTL {
		return true
	}
	for _, d := range r.live[name] {
		if d.decl.Spec.Team == team && !now.Before(d.expires) && now.Sub(d.expires) < protocol.LeaseTTL {
			return true
		}
	}
	return false
}

// fleetGauge is what the registry knows of one function's executors.
type fleetGauge struct {
	team, function     string
	executors, schemas int64
}

// fleet returns, for each function with a live declaration of its owning
// team, how many executor processes serve it and how many distinct
// schemas they declare.
func (r *registry) fleet() []fleetGauge {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]fleetGauge, 0, len(r.live))
	for name := range r.live {
		owner := r.owners[name]
		if owner == nil {
			continue
		}
		live := r.liveOf(name, owner.Team)
		digests := map[string]bool{}
		for _, d := range live {
			digests[d.digest] = true
		}
		out = append(out, fleetGauge{team: owner.Team, function: name, executors: int64(len(live)), schemas: int64(len(digests))})
	}
	return out
}

// validate checks arguments against the live declarations' schemas (see
// registry). It returns the digest of the schema they match, or a message
// for the model when they match none.
func (f *function) validate(args []byte) (digest, problem string) {
	if len(f.live) == 0 {
		return "", ""
	}
	for i, d := range f.live {
		if slices.ContainsFunc(f.live[:i], func(e *declared) bool { return e.schema == d.schema }) {
			continue // tried already
		}
		if d.schema.Check(args) == "" {
			return d.digest, ""
		}
	}
	return "", f.live[0].schema.Check(args)
}

// served returns the functions of the teams sees accepts that a live
// executor of their owning team serves, by name, each as its newest live
// declaration describes it; with accepted, with the description and schema
// of its claim, the definition last accepted (Options.DefinitionApproval).
func (r *registry) served(sees func(team string) bool, accepted bool) []*protocol.FunctionSpec {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []*protocol.FunctionSpec
	for name := range r.live {
		owner := r.owners[name]
		if owner == nil || !sees(owner.Team) {
			continue
		}
		if live := r.liveOf(name, owner.Team); len(live) > 0 {
			spec := &live[0].decl.Spec
			if accepted {
				c := *spec
				c.Description, c.Parameters = owner.Description, owner.Parameters
				c.Title, c.Icons, c.OutputSchema = owner.Title, owner.Icons, owner.OutputSchema
				spec = &c
			}
			out = append(out, spec)
		}
	}
	slices.SortFunc(out, func(a, b *protocol.FunctionSpec) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// compileFormat returns the checker of a custom tool's input (a spec with
// a Format): text, matching its regex grammar when it has one. A Lark
// grammar is the platform's to enforce: it constrains what the model
// writes, and toolrelay does not check it again.
func compileFormat(spec *protocol.FunctionSpec) (*schema.Schema, error) {
	if err := spec.Format.Validate(spec.Name); err != nil {
		return nil, err
	}
	re, err := spec.Format.Regex()
	if err != nil {
		return nil, err
	}
	src, _ := json.Marshal(spec.Format)
	return schema.CompileText(spec.Name, src, re), protocol.ValidateToolText(spec.Name, spec.Description, nil)
}
