package dispatch

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Dispatchers are the registry's only writers. Executors send their
// declarations as requests (protocol.DeclareRequest) on their team's
// subject, which a deployment with an account per team lets only that team
// publish to; the dispatcher that answers decides ownership (the first team
// to declare a name owns it), stores the declarations of the owner as
// leases, and refuses the rest, so a squatter's declaration never reaches
// the registry and never receives a call. A declaration whose tool text
// (description, schema strings) breaks protocol.ValidateToolText's bounds
// is refused before it can claim a name: the executor need not be ours. So
// is one whose schema does not compile or breaks a bound of package schema,
// with the error naming the bound.

// declareTimeout bounds the registry writes of one request.
const declareTimeout = 5 * time.Second

// Reasons a declaration is refused, as the refused counter labels them.
const (
	refusedOwned    = "owned_by_other_team"
	refusedTooMany  = "too_many"
	refusedToolText = "tool_text"
	refusedSchema   = "schema"
)

func (d *Dispatcher) serveDeclarations(ctx context.Context) (stop func(), err error) {
	sub, err := d.js.Conn().QueueSubscribe(protocol.DeclareSubjectPrefix+".*", queueGroup, func(m *nats.Msg) {
		reply := d.declare(ctx, m.Subject, m.Data)
		b, _ := json.Marshal(reply)
		_ = m.Respond(b)
	})
	if err != nil {
		return nil, err
	}
	// Ready means executors can declare: the server must have the
	// subscription before Run says so, not merely this client.
	if err := d.js.Conn().FlushTimeout(declareTimeout); err != nil {
		_ = sub.Unsubscribe()
		return nil, err
	}
	// Declarations come and go here; calls left with nobody to run them
	// are failed (orphans.go).
	stopOrphans := d.watchOrphans(ctx)
	return func() { _ = sub.Drain(); stopOrphans() }, nil
}

// declare carries out one executor's DeclareRequest.
func (d *Dispatcher) declare(ctx context.Context, subject string, data []byte) *protocol.DeclareReply {
	reply := &protocol.DeclareReply{Version: protocol.Version}
	team, err := protocol.ParseDeclareSubject(subject)
	var req *protocol.DeclareRequest
	if err == nil {
		req, err = protocol.DecodeDeclareRequest(team, data)
	}
	if err != nil {
		d.log.Warn("refusing a malformed declare request", "subject", subject, "size", len(data), "err", err)
		reply.Error = err.Error()
		return reply
	}
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
	for i := range req.Declarations {
		decl := &req.Declarations[i]
		// Before the claim: text that breaks a bound claims no name.
		// The schema's bounds first: they cost one pass to check, where
		// reading the tool text of a schema nested thousands deep does not.
		if _, err := d.registry.compiled(&decl.Spec); err != nil && !errors.Is(err, protocol.ErrToolText) {
			d.refuse(ctx, reply, decl, refusedSchema, "", err.Error())
			continue
		}
		if err := decl.Spec.ValidateToolText(); err != nil {
			d.refuse(ctx, reply, decl, refusedToolText, "", err.Error())
			continue
		}
		owner, err := d.registry.claim(ctx, &decl.Spec)
		if err != nil {
			reply.Error = err.Error()
			return reply
		}
		known := d.registry.declared(decl)
		switch {
		case owner != team:
			d.refuse(ctx, reply, decl, refusedOwned, owner,
				fmt.Sprintf("%s is owned by team %q; team %q cannot serve it (pick another name, or ask %q to hand it over)", decl.Spec.Name, owner, team, owner))
			continue
		case room <= 0 && !known:
			d.refuse(ctx, reply, decl, refusedTooMany, "",
				fmt.Sprintf("team %q has %d live declarations, the most it may have", team, d.opts.MaxDeclarationsPerTeam))
			continue
		}
		value, err := protocol.EncodeDeclaration(decl)
		if err == nil {
			_, err = d.registry.decls.Put(ctx, decl.Key(), value)
		}
		if err != nil {
			reply.Error = fmt.Sprintf("declare %s: %v", decl.Spec.Name, err)
			return reply
		}
		if !known {
			room--
			d.noteDefinition(ctx, decl) // a process starting: has the definition changed?
		}
		reply.Accepted = append(reply.Accepted, decl.Spec.Name)
	}
	return reply
}

func (d *Dispatcher) refuse(ctx context.Context, reply *protocol.DeclareReply, decl *protocol.Declaration, reason, owner, msg string) {
	reply.Refused = append(reply.Refused, protocol.Refusal{Function: decl.Spec.Name, Owner: owner, Reason: msg})
	d.tel.refused.Add(ctx, 1, metric.WithAttributes(attrTeam.String(decl.Spec.Team), attribute.String("reason", reason)))
	if d.registry.noteRefusal(decl, reason) {
		d.log.WarnContext(ctx, "refused a declaration", "team", decl.Spec.Team, "fn", decl.Spec.Name,
			"executor", decl.Executor, "instance", decl.Instance, "reason", msg)
	}
}
