package dispatch

import (
	"cmp"
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// FunctionView is a function as GET /v1/functions and the console show
// it: its claim in the registry, the executors serving it now, and the
// figures the dispatcher has of it.
type FunctionView struct {
	Name        string `json:"name"`
	Team        string `json:"team"`
	Description string `json:"description,omitempty"`
	// Version is the team's own version label, of the newest live
	// executor (else of the claim).
	Version string `json:"version,omitempty"`
	// Parameters is the schema the newest live executor declares (else
	// the claim's); SchemaDigest identifies it by content.
	Parameters   json.RawMessage `json:"parameters"`
	SchemaDigest string          `json:"schema_digest"`
	// DefinitionDigest identifies the description and schema together
	// (what the model reads), as Description and Parameters show them.
	// DefinitionChangedAt is when an executor last started serving the
	// function with another definition than the one before, whose digest
	// PreviousDefinitionDigest is; both are empty while the definition
	// has not changed since the function was claimed.
	DefinitionDigest         string     `json:"definition_digest"`
	DefinitionChangedAt      *time.Time `json:"definition_changed_at,omitempty"`
	PreviousDefinitionDigest string     `json:"previous_definition_digest,omitempty"`
	// PendingDefinitions, with Options.DefinitionApproval, are the
	// definitions live executors declare that an admin has not accepted:
	// agents read Description and Parameters (the one last accepted)
	// until one of these is.
	PendingDefinitions []PendingDefinition `json:"pending_definitions,omitempty"`
	Timeout            string              `json:"timeout,omitempty"`
	MaxConcurrency     int                 `json:"max_concurrency,omitempty"`
	SideEffects        bool                `json:"side_effects,omitempty"`
	// Executors are the processes serving it now (live declarations), newest
	// first. Schemas lists the distinct schemas they declare when they
	// disagree (more than one).
	Executors []ExecutorView  `json:"executors"`
	Schemas   []SchemaVariant `json:"schemas,omitempty"`
	Queue     *FunctionQueue  `json:"queue,omitempty"`
	Stats     FunctionStats   `json:"stats"`
}

// PendingDefinition is a definition of a function that live executors
// declare and an admin has not accepted, and which executors
// ("name/instance") declare it.
type PendingDefinition struct {
	Digest      string          `json:"definition_digest"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
	Executors   []string        `json:"executors"`
}

// pendingDefinitions are the definitions of live other than claim's.
func pendingDefinitions(claim *protocol.FunctionSpec, live []*declared) []PendingDefinition {
	accepted := DefinitionDigest(claim)
	var out []PendingDefinition
	for _, d := range live { // newest first
		digest := DefinitionDigest(&d.decl.Spec)
		if digest == accepted {
			continue
		}
		i := slices.IndexFunc(out, func(p PendingDefinition) bool { return p.Digest == digest })
		if i < 0 {
			out = append(out, PendingDefinition{Digest: digest, Description: d.decl.Spec.Description, Parameters: d.decl.Spec.Parameters})
			i = len(out) - 1
		}
		out[i].Executors = append(out[i].Executors, d.decl.Executor+"/"+d.decl.Instance)
	}
	return out
}

// ExecutorView is one executor process serving a function.
type ExecutorView struct {
	Name     string    `json:"name"`
	Instance string    `json:"instance"`
	Since    time.Time `json:"since"`
	Version  string    `json:"version,omitempty"`
	Schema   string    `json:"schema_digest"`
}

// SchemaVariant is one of the schemas live executors of a function
// declare, and which executors ("name/instance") declare it.
type SchemaVariant struct {
	Digest    string   `json:"digest"`
	Executors []string `json:"executors"`
}

// FunctionQueue is what JetStream says of a function's calls, as the
// gauges last read it (every few seconds): waiting for an executor
// (consumer lag), delivered and not yet acknowledged, and dead letters.
type FunctionQueue struct {
	Queued      int64     `json:"queued"`
	InFlight    int64     `json:"in_flight"`
	DeadLetters int64     `json:"dead_letters"`
	ReadAt      time.Time `json:"read_at"`
}

// InspectFunctions lists the functions of the teams caller sees: every
// function a team claims, served now or not, by name.
func (d *Dispatcher) InspectFunctions(ctx context.Context, caller Caller) []FunctionView {
	views := d.registry.views(caller, d.opts.DefinitionApproval)
	d.tel.gaugesMu.Lock()
	g := d.tel.gauges
	d.tel.gaugesMu.Unlock()
	for i := range views {
		v := &views[i]
		if !g.refreshedAt.IsZero() {
			q := &FunctionQueue{ReadAt: g.refreshedAt}
			for _, f := range g.functions {
				if f.team == v.Team && f.function == v.Name {
					q.Queued, q.InFlight = f.queued, f.running
				}
			}
			for _, f := range g.deadLetters {
				if f.team == v.Team && f.function == v.Name {
					q.DeadLetters = f.queued
				}
			}
			v.Queue = q
		}
		v.Stats = d.inspect.stats.of(v.Name)
	}
	return views
}

// views returns the registry's functions caller sees, by name; with
// accepted, each described by the definition last accepted, and the live
// ones awaiting acceptance listed (Options.DefinitionApproval).
func (r *registry) views(caller Caller, accepted bool) []FunctionView {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := []FunctionView{}
	for name, spec := range r.owners {
		if !caller.Sees(spec.Team) {
			continue
		}
		v := FunctionView{Name: name, Team: spec.Team, Description: spec.Description, Version: spec.FunctionVersion,
			Parameters: spec.Parameters, SchemaDigest: schema.Digest(spec.Parameters), MaxConcurrency: spec.MaxConcurrency,
			SideEffects: spec.SideEffects, Executors: []ExecutorView{}}
		live := r.liveOf(name, spec.Team)
		if len(live) > 0 {
			newest := live[0].decl.Spec
			v.Description, v.Version, v.Parameters = newest.Description, newest.FunctionVersion, newest.Parameters
			v.SchemaDigest, v.MaxConcurrency, v.SideEffects = live[0].digest, newest.MaxConcurrency, newest.SideEffects
			spec = &newest
		}
		if spec.Timeout > 0 {
			v.Timeout = time.Duration(spec.Timeout).String()
		}
		if claim := r.owners[name]; accepted {
			v.Description, v.Parameters, v.SchemaDigest = claim.Description, claim.Parameters, schema.Digest(claim.Parameters)
			v.PendingDefinitions = pendingDefinitions(claim, live)
		}
		v.DefinitionDigest = DefinitionDigest(&protocol.FunctionSpec{Description: v.Description, Parameters: v.Parameters})
		if c, ok := r.changes[name]; ok {
			v.DefinitionChangedAt, v.PreviousDefinitionDigest = &c.at, c.previous
		}
		byDigest := map[string][]string{}
		for _, d := range live {
			v.Executors = append(v.Executors, ExecutorView{Name: d.decl.Executor, Instance: d.decl.Instance, Since: d.decl.StartedAt,
				Version: d.decl.Spec.FunctionVersion, Schema: d.digest})
			byDigest[d.digest] = append(byDigest[d.digest], d.decl.Executor+"/"+d.decl.Instance)
		}
		if len(byDigest) > 1 {
			for digest, execs := range byDigest {
				v.Schemas = append(v.Schemas, SchemaVariant{Digest: digest, Executors: execs})
			}
			slices.SortFunc(v.Schemas, func(a, b SchemaVariant) int { return cmp.Compare(a.Digest, b.Digest) })
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b FunctionView) int { return cmp.Compare(a.Name, b.Name) })
	return out
}
