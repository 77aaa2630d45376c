package dispatch

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolrelay/toolrelay/internal/jspub"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Dispatchers are the registry's only writers. Executors send their
// declarations as requests (protocol.DeclareRequest) on their team's
// subject, which a deployment with an account per team lets only that team
// publish to; the dispatcher that answers decides ownership (the first team
// to declare a name owns it), stores the declarations of the owner (each
// lapses unless renewed), and refuses the rest, so a squatter's declaration never reaches
// the registry and never receives a call. A declaration whose tool text
// (description, schema strings) breaks protocol.ValidateToolText's bounds
// is refused before it can claim a name: the executor need not be ours. So
// is one whose schema does not compile or breaks a bound of package schema,
// with the error naming the bound.

// declareTimeout bounds the registry writes of one request: the answer
// must reach the executor before it gives up waiting (protocol.DeclareWait).
const declareTimeout = protocol.DeclareWait - time.Second

// Reasons a declaration is refused, as the refused counter labels them.
const (
	refusedOwned    = "owned_by_other_team"
	refusedTooMany  = "too_many"
	refusedToolText = "tool_text"
	refusedSchema   = "schema"
	refusedTooLarge = "too_large"
	// refusedBusy counts requests a full queue refused (declarequeue.go).
	refusedBusy = "busy"
)

func (d *Dispatcher) serveDeclarations(ctx context.Context) (stop func(), err error) {
	qctx, cancel := context.WithCancel(ctx)
	q := &declareQueues{ctx: qctx, take: d.declare, renew: d.registry.renews, depth: d.opts.DeclareQueuePerTeam,
		sem: make(chan struct{}, declareWorkers), teams: map[string]*teamQueue{},
		busy: func(team string) {
			d.tel.refused.Add(ctx, 1, metric.WithAttributes(attrTeam.String(team), attribute.String("reason", refusedBusy)))
		}}
	sub, err := d.js.Conn().QueueSubscribe(protocol.DeclareSubjectPrefix+".*", queueGroup, q.enqueue)
	if err != nil {
		cancel()
		return nil, err
	}
	// Ready means executors can declare: the server must have the
	// subscription before Run says so, not merely this client.
	if err := d.js.Conn().FlushTimeout(declareTimeout); err != nil {
		_ = sub.Unsubscribe()
		cancel()
		return nil, err
	}
	// Declarations come and go here; calls left with nobody to run them
	// are failed (orphans.go), and claims nobody serves are released (release.go).
	stopOrphans := d.watchOrphans(ctx)
	var releases sync.WaitGroup
	releases.Go(func() { d.registry.releaseEvery(qctx, d.opts.ClaimGrace) })
	return func() { _ = sub.Drain(); cancel(); q.wait(); releases.Wait(); stopOrphans() }, nil
}

// declare carries out one executor's DeclareRequest, of team.
func (d *Dispatcher) declare(ctx context.Context, team string, req *protocol.DeclareRequest) *protocol.DeclareReply {
	reply := &protocol.DeclareReply{Version: protocol.Version}
	ctx, cancel := context.WithTimeout(ctx, declareTimeout)
	defer cancel()
	if req.Op == protocol.DeclareWithdraw {
		for i := range req.Declarations {
			decl := &req.Declarations[i]
			if err := d.registry.decls.Delete(ctx, decl.Key()); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
				reply.Error = fmt.Sprintf("withdraw %s: %v", decl.Spec.Name, err)
				return reply
			}
			reply.Accepted = append(reply.Accepted, decl.Spec.Name)
		}
		return reply
	}
	if _, err := d.gather.streams.stream(ctx, team); err != nil {
		reply.Error = err.Error()
		return reply
	}
	room := d.opts.MaxDeclarationsPerTeam - d.registry.declarationsOf(team, req.Declarations)
	// The writes under way, and the registry bytes they add that the
	// registry does not count yet. settle waits for the oldest and takes
	// it into the cache.
	var writes []declWrite
	var pending int64
	settle := func() error {
		w := writes[0]
		rev := w.rev
		if w.ack != nil {
			select {
			case <-w.ack.Done():
			case <-ctx.Done():
				return fmt.Errorf("declare %s: %w", w.decl.Spec.Name, ctx.Err())
			}
			var err error
			if rev, err = w.ack.Result(); err != nil {
				return fmt.Errorf("declare %s: %w", w.decl.Spec.Name, err)
			}
		}
		writes, pending = writes[1:], pending-w.grows
		d.registry.putDeclared(w.decl.Key(), w.decl, w.value, w.sum, rev, true)
		if w.fresh {
			d.noteDefinition(ctx, w.decl) // a process starting: has the definition changed?
		}
		reply.Accepted = append(reply.Accepted, w.decl.Spec.Name)
		return nil
	}
	for i := range req.Declarations {
		decl := &req.Declarations[i]
		// A renewal sends the bytes stored already, which were checked
		// then. Anything else is checked before the claim: text that
		// breaks a bound claims no name. The schema's bounds first: they
		// cost one pass to check, where reading the tool text of a schema
		// nested thousands deep does not.
		value, err := protocol.EncodeDeclaration(decl)
		sum := sha256.Sum256(value)
		if err != nil || !d.registry.unchanged(decl.Key(), decl.Spec.Name, sum) {
			if _, err := d.registry.compiled(&decl.Spec); err != nil && !errors.Is(err, protocol.ErrToolText) {
				d.refuse(ctx, reply, decl, refusedSchema, "", err.Error())
				continue
			}
			if err := decl.Spec.ValidateToolText(); err != nil {
				d.refuse(ctx, reply, decl, refusedToolText, "", err.Error())
				continue
			}
			if err == nil {
				err = decl.ValidateSize(len(value))
			}
			if err != nil {
				d.refuse(ctx, reply, decl, refusedTooLarge, "", err.Error())
				continue
			}
		}
		// So is a name over the team's quotas, or another team's.
		q := d.registry.standing(decl)
		switch {
		case q.owner != "":
			d.refuse(ctx, reply, decl, refusedOwned, q.owner, ownedBy(decl.Spec.Name, q.owner, q.owned, team))
			continue
		case !q.owns && q.names >= d.opts.MaxDeclarationsPerTeam:
			d.refuse(ctx, reply, decl, refusedTooMany, "",
				fmt.Sprintf("team %q owns %d function names, the most it may (TOOLRELAY_MAX_DECLARATIONS_PER_TEAM); names it no longer serves are released %s after their last executor stops (TOOLRELAY_CLAIM_GRACE)",
					team, q.names, d.opts.ClaimGrace))
			continue
		case room <= 0 && !q.known:
			d.refuse(ctx, reply, decl, refusedTooMany, "",
				fmt.Sprintf("team %q has %d live declarations, the most it may have (TOOLRELAY_MAX_DECLARATIONS_PER_TEAM)", team, d.opts.MaxDeclarationsPerTeam))
			continue
		}
		grows := int64(len(value) - q.size)
		if !q.owns {
			grows += int64(len(value)) // and its claim
		}
		if grows > 0 && q.bytes+pending+grows > d.opts.MaxRegistryBytesPerTeam {
			d.refuse(ctx, reply, decl, refusedTooLarge, "",
				fmt.Sprintf("%v: team %q's declarations and claims take %d bytes of the registry; this one (%d bytes) would take it over the limit of %d (TOOLRELAY_MAX_REGISTRY_BYTES_PER_TEAM)",
					protocol.ErrTooLarge, team, q.bytes+pending, len(value), d.opts.MaxRegistryBytesPerTeam))
			continue
		}
		owner, owned, err := d.registry.claim(ctx, &decl.Spec, !q.served)
		if err != nil {
			reply.Error = err.Error()
			return reply
		}
		if owner != team {
			d.refuse(ctx, reply, decl, refusedOwned, owner, ownedBy(decl.Spec.Name, owner, owned, team))
			continue
		}
		// Written as the turn engine writes its records, without
		// waiting for each acknowledgement: a request's declarations
		// cost a few round trips, not one each. At most declareWindow
		// are under way, so that declarations leave the publisher's
		// room (shared with the turns) to the turns.
		if len(writes) == declareWindow {
			if err := settle(); err != nil {
				reply.Error = err.Error()
				return reply
			}
		}
		w := declWrite{decl: decl, value: value, sum: sum, fresh: !q.known, grows: max(int64(len(value)-q.size), 0)}
		w.ack, err = d.async.Publish(&nats.Msg{Subject: kvSubject(protocol.DeclarationBucket, decl.Key()), Data: value})
		if errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			// The turns fill the publisher (a slow stream): written on
			// its own, so that renewals do not fail, and leases lapse,
			// for as long as the turns keep it full.
			w.rev, err = d.registry.decls.Put(ctx, decl.Key(), value)
		}
		if err != nil {
			reply.Error = fmt.Sprintf("declare %s: %v", decl.Spec.Name, err)
			return reply
		}
		writes, pending = append(writes, w), pending+w.grows
		if !q.known {
			room--
		}
	}
	for len(writes) > 0 {
		if err := settle(); err != nil {
			reply.Error = err.Error()
			return reply
		}
	}
	return reply
}

// declareWindow bounds the declaration writes one request has under way:
// the declare workers together have at most declareWorkers × declareWindow
// (512) of the asynchronous publisher's asyncMaxPending (4,096).
const declareWindow = 32

// declWrite is a declaration on its way to the registry.
type declWrite struct {
	decl  *protocol.Declaration
	value []byte
	sum   [sha256.Size]byte
	ack   *jspub.Future // nil: written at rev already
	rev   uint64
	fresh bool  // not live before: a process starting
	grows int64 // the registry bytes it adds
}

func (d *Dispatcher) refuse(ctx context.Context, reply *protocol.DeclareReply, decl *protocol.Declaration, reason, owner, msg string) {
	reply.Refused = append(reply.Refused, protocol.Refusal{Function: decl.Spec.Name, Owner: owner, Reason: msg})
	d.tel.refused.Add(ctx, 1, metric.WithAttributes(attrTeam.String(decl.Spec.Team), attribute.String("reason", reason)))
	if d.registry.noteRefusal(decl, reason) {
		d.log.WarnContext(ctx, "refused a declaration", "team", decl.Spec.Team, "fn", decl.Spec.Name,
			"executor", decl.Executor, "instance", decl.Instance, "reason", msg)
	}
}
