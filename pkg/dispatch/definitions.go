package dispatch

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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

// definitionChange is when a function's definition last changed, and the
// digest of the one before.
type definitionChange struct {
	at       time.Time
	previous string
}

// definitionDigest identifies a function's definition (description and
// parameters' schema) by content: 16 hex characters.
func definitionDigest(s *protocol.FunctionSpec) string {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s\x00%s", len(s.Description), s.Description, schema.Digest(s.Parameters))
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// definitionUpdateTries bounds the compare-and-set rounds of one change.
const definitionUpdateTries = 3

// noteDefinition records decl's definition as its function's, if it
// differs from the claim's: decl is the first declaration of a process.
// A failure is logged: the definition agents see is the newest live
// declaration's either way, only the record of the change is missing.
func (d *Dispatcher) noteDefinition(ctx context.Context, decl *protocol.Declaration) {
	claim, rev := d.registry.claimOf(decl.Spec.Name)
	for range definitionUpdateTries {
		if claim == nil || claim.Team != decl.Spec.Team {
			return
		}
		was, now := definitionDigest(claim), definitionDigest(&decl.Spec)
		if was == now {
			return
		}
		spec := decl.Spec
		spec.UpdatedAt = time.Now().UTC()
		data, err := protocol.EncodeFunctionSpec(&spec)
		if err == nil {
			_, err = d.registry.claims.Update(ctx, spec.Name, data, rev)
		}
		if err == nil {
			d.tel.definitionChanges.Add(ctx, 1, metric.WithAttributes(attrTeam.String(spec.Team), attrFunction.String(spec.Name)))
			d.log.WarnContext(ctx, "a function's definition (description or schema) changed: agents now read the new one",
				"fn", spec.Name, "team", spec.Team, "executor", decl.Executor, "instance", decl.Instance,
				"version", spec.FunctionVersion, "definition", now, "previous_definition", was,
				"description_bytes", len(spec.Description), "previous_description_bytes", len(claim.Description),
				"schema", schema.Digest(spec.Parameters), "previous_schema", schema.Digest(claim.Parameters))
			return
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			d.log.ErrorContext(ctx, "could not record a function's new definition", "fn", spec.Name, "team", spec.Team, "err", err)
			return
		}
		// Another replica changed the claim meanwhile: compare with its.
		e, err := d.registry.claims.Get(ctx, spec.Name)
		if err != nil {
			d.log.ErrorContext(ctx, "could not record a function's new definition", "fn", spec.Name, "team", spec.Team, "err", err)
			return
		}
		if claim, err = protocol.DecodeFunctionSpec(e.Value()); err != nil {
			return
		}
		rev = e.Revision()
	}
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
		if was := definitionDigest(old); was != definitionDigest(spec) {
			r.changes[spec.Name] = definitionChange{at: e.Created(), previous: was}
		}
	}
	r.owners[spec.Name] = spec
	r.claimRevs[spec.Name] = e.Revision()
}
