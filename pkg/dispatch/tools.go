package dispatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/schema"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// FunctionStatus is a function as the fleet serves it now.
type FunctionStatus struct {
	// Spec is the newest live declaration's (the last process to start),
	// or, for a function no executor serves, its team's claim.
	Spec *protocol.FunctionSpec
	// Executors are the live declarations of the owning team, newest first.
	Executors []ExecutorStatus
	// Schemas counts the distinct schemas the executors declare; more than
	// one means the replicas disagree (a rollout, or a mistake).
	Schemas int
	// Accepted is the team's claim: the definition (description and
	// schema) last accepted, which agents read under
	// Options.DefinitionApproval.
	Accepted *protocol.FunctionSpec
}

// Changed reports whether the newest executor declares a definition
// (description or schema) other than the one last accepted.
func (s FunctionStatus) Changed() bool {
	return s.Accepted != nil && DefinitionDigest(s.Spec) != DefinitionDigest(s.Accepted)
}

// Served reports whether a live executor serves the function.
func (s FunctionStatus) Served() bool { return len(s.Executors) > 0 }

// ExecutorStatus is one executor process's live declaration.
type ExecutorStatus struct {
	Executor  string
	Instance  string
	StartedAt time.Time
	// Schema identifies the declared schema by content.
	Schema string
}

// Registry reads which team owns each function and which executor
// processes serve it now, sorted by name. Declarations of processes whose
// lease lapsed are gone (the server removes them); those of a team that
// does not own the name are left out.
func Registry(ctx context.Context, js jetstream.JetStream) ([]FunctionStatus, error) {
	claims, err := readBucket(ctx, js, protocol.RegistryBucket)
	if err != nil {
		return nil, err
	}
	decls, err := readBucket(ctx, js, protocol.DeclarationBucket)
	if err != nil {
		return nil, err
	}
	byName := map[string][]*protocol.Declaration{}
	for key, data := range decls {
		d, err := protocol.DecodeDeclaration(data)
		if err != nil || d.Key() != key {
			continue
		}
		byName[d.Spec.Name] = append(byName[d.Spec.Name], d)
	}
	var out []FunctionStatus
	for name, data := range claims {
		claim, err := protocol.DecodeFunctionSpec(data)
		if err != nil || claim.Name != name {
			continue
		}
		st := FunctionStatus{Spec: claim, Accepted: claim}
		live := slices.DeleteFunc(byName[name], func(d *protocol.Declaration) bool { return d.Spec.Team != claim.Team })
		slices.SortFunc(live, func(a, b *protocol.Declaration) int { return b.StartedAt.Compare(a.StartedAt) })
		schemas := map[string]bool{}
		for i, d := range live {
			if i == 0 {
				st.Spec = &d.Spec
			}
			digest := schema.Digest(d.Spec.Parameters)
			schemas[digest] = true
			st.Executors = append(st.Executors, ExecutorStatus{Executor: d.Executor, Instance: d.Instance, StartedAt: d.StartedAt, Schema: digest})
		}
		st.Schemas = len(schemas)
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b FunctionStatus) int { return strings.Compare(a.Spec.Name, b.Spec.Name) })
	return out, nil
}

// readBucket returns every key's value in a bucket; a bucket not created
// yet is empty.
func readBucket(ctx context.Context, js jetstream.JetStream, bucket string) (map[string][]byte, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry: %w", err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("dispatch: registry: %w", err)
	}
	out := map[string][]byte{}
	for k := range keys.Keys() {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue // deleted or expired meanwhile
		}
		out[k] = e.Value()
	}
	return out, nil
}

// Functions lists the functions live executors serve, by name, each as
// its newest live declaration describes it.
func Functions(ctx context.Context, js jetstream.JetStream) ([]*protocol.FunctionSpec, error) {
	all, err := Registry(ctx, js)
	if err != nil {
		return nil, err
	}
	var specs []*protocol.FunctionSpec
	for _, f := range all {
		if f.Served() {
			specs = append(specs, f.Spec)
		}
	}
	return specs, nil
}
