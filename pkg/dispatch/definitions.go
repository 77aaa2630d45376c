package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Change control of what agents read. A function's definition is its
// description and its parameters' schema: what the model is told. Its
// team's claim in the registry bucket holds the definition last accepted.
// When an executor process starts serving a function with another
// definition, the dispatcher that takes its declaration in replaces the
// claim's (compare-and-set, so one replica does it), logs the change and
// counts it (toolrelay.registry.definition_changes). Every replica learns
// of it from the bucket, whose history (protocol.RegistryBucketSpec) keeps
// the previous definitions, and shows when the definition last changed and
// what it was before in GET /v1/functions and the console.
//
// Only a process starting counts: during a rolling deploy, renewals of the
// old version's declarations do not flip the definition back and forth.
//
// With Options.DefinitionApproval the claim is not replaced: agents go on
// reading the definition last accepted (tools/list, GET /v1/tools), the
// new one is listed as pending in GET /v1/functions and the console, and
// an admin accepts it with POST /v1/functions/{name}/accept.

// definitionChange is when a function's definition last changed, and the
// digest of the one before.
type definitionChange struct {
	at       time.Time
	previous string
}

// DefinitionDigest identifies a function's definition (what agents and
// the people using them read: its description, its parameters' schema or
// custom tool format, its title, icons and output schema when it has
// them; and its approval policy, which decides whether a call runs at
// all) by content, as 16 hex characters: the definition_digest of the
// HTTP API. A function without the optional parts keeps the digest it had
// before they existed.
func DefinitionDigest(s *protocol.FunctionSpec) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s\x00%s", len(s.Description), s.Description, schema.Digest(s.Parameters))
	if s.Format != nil { // a custom tool's format is what agents read in place of a schema
		f, _ := json.Marshal(s.Format)
		fmt.Fprintf(h, "\x00format:%s", f)
	}
	if s.Title != "" || len(s.Icons) > 0 || len(s.OutputSchema) > 0 {
		icons, _ := json.Marshal(s.Icons)
		fmt.Fprintf(h, "\x00display:%d:%s\x00%s\x00%s", len(s.Title), s.Title, icons, schema.Digest(s.OutputSchema))
	}
	if s.Approval != nil { // who must agree before a call runs is reviewed like what it does
		policy, _ := json.Marshal(s.Approval)
		fmt.Fprintf(h, "\x00approval:%s", policy)
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// definitionUpdateTries bounds the compare-and-set rounds of one change.
const definitionUpdateTries = 3

// noteDefinition records decl's definition as its function's, if it
// differs from the claim's: decl is the first declaration of a process.
// With Options.DefinitionApproval it only logs that the definition awaits
// an admin. A failure is logged: the definition agents see is the newest
// live declaration's either way, only the record of the change is missing.
func (d *Dispatcher) noteDefinition(ctx context.Context, decl *protocol.Declaration) {
	claim, _ := d.registry.claimOf(decl.Spec.Name)
	if claim == nil || claim.Team != decl.Spec.Team || DefinitionDigest(claim) == DefinitionDigest(&decl.Spec) {
		return
	}
	if d.opts.DefinitionApproval {
		d.log.WarnContext(ctx, "a function's definition (description or schema) changed and awaits an admin's acceptance; agents read the one accepted before",
			"fn", decl.Spec.Name, "team", decl.Spec.Team, "executor", decl.Executor, "instance", decl.Instance,
			"definition", DefinitionDigest(&decl.Spec), "accepted_definition", DefinitionDigest(claim),
			"accept", "POST /v1/functions/"+decl.Spec.Name+"/accept")
		return
	}
	if err := d.replaceDefinition(ctx, decl.Spec, "executor "+decl.Executor+"/"+decl.Instance); err != nil {
		d.log.ErrorContext(ctx, "could not record a function's new definition", "fn", decl.Spec.Name, "team", decl.Spec.Team, "err", err)
	}
}

// replaceDefinition makes spec's definition its function's claim, by
// compare-and-set (re-reading the claim on a conflict), then logs and
// counts the change, naming by (an executor, or the admin who accepted
// it). A claim of another team, or with spec's definition already, is left.
func (d *Dispatcher) replaceDefinition(ctx context.Context, spec protocol.FunctionSpec, by string) error {
	claim, rev := d.registry.claimOf(spec.Name)
	for range definitionUpdateTries {
		if claim == nil || claim.Team != spec.Team {
			return nil
		}
		was, now := DefinitionDigest(claim), DefinitionDigest(&spec)
		if was == now {
			return nil
		}
		spec.UpdatedAt = time.Now().UTC()
		data, err := protocol.EncodeFunctionSpec(&spec)
		if err != nil {
			return err
		}
		_, err = d.registry.claims.Update(ctx, spec.Name, data, rev)
		if err == nil {
			d.tel.definitionChanges.Add(ctx, 1, metric.WithAttributes(attrTeam.String(spec.Team), attrFunction.String(spec.Name)))
			d.log.WarnContext(ctx, "a function's definition (description or schema) changed: agents now read the new one",
				"fn", spec.Name, "team", spec.Team, "by", by, "version", spec.FunctionVersion, "definition", now, "previous_definition", was,
				"description_bytes", len(spec.Description), "previous_description_bytes", len(claim.Description),
				"schema", schema.Digest(spec.Parameters), "previous_schema", schema.Digest(claim.Parameters))
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return err
		}
		// Another replica changed the claim meanwhile: compare with its.
		e, err := d.registry.claims.Get(ctx, spec.Name)
		if err != nil {
			return err
		}
		if claim, err = protocol.DecodeFunctionSpec(e.Value()); err != nil {
			return err
		}
		rev = e.Revision()
	}
	return fmt.Errorf("dispatch: replace the definition of %s: the claim kept changing", spec.Name)
}

// AcceptDefinition makes the definition with digest (see
// [DefinitionDigest]) that a live executor of the function name declares
// the one agents read, recording by (who accepted it) in the log: how an
// admin accepts a changed definition under [Options.DefinitionApproval].
// It returns an error wrapping [ErrNotFound] when no live executor of name
// declares that definition, and other errors when the registry cannot be
// written; it waits for JetStream at most 5 s.
func (d *Dispatcher) AcceptDefinition(ctx context.Context, name, digest, by string) error {
	spec := d.registry.liveDefinition(name, digest)
	if spec == nil {
		return fmt.Errorf("%w: no live executor of %s declares definition %s", ErrNotFound, name, digest)
	}
	ctx, cancel := context.WithTimeout(ctx, declareTimeout)
	defer cancel()
	return d.replaceDefinition(ctx, *spec, by)
}

// liveDefinition returns the spec of a live declaration of name, of its
// owning team, whose definition has digest; nil if there is none.
func (r *registry) liveDefinition(name, digest string) *protocol.FunctionSpec {
	r.mu.RLock()
	defer r.mu.RUnlock()
	owner := r.owners[name]
	if owner == nil {
		return nil
	}
	for _, d := range r.liveOf(name, owner.Team) {
		if DefinitionDigest(&d.decl.Spec) == digest {
			spec := d.decl.Spec
			return &spec
		}
	}
	return nil
}

// claimOf returns name's claim as the cache has it, and its revision.
func (r *registry) claimOf(name string) (*protocol.FunctionSpec, uint64) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.owners[name], r.claimRevs[name]
}

// noteClaim keeps the claim of an entry of the registry bucket and, when
// it replaces one of the same team with another definition, the change;
// r.mu is held.
func (r *registry) noteClaim(spec *protocol.FunctionSpec, e jetstream.KeyValueEntry) {
	if old := r.owners[spec.Name]; old != nil && old.Team == spec.Team {
		if was := DefinitionDigest(old); was != DefinitionDigest(spec) {
			r.changes[spec.Name] = definitionChange{at: e.Created(), previous: was}
		}
	}
	r.owners[spec.Name] = spec
	r.claimRevs[spec.Name] = e.Revision()
}
