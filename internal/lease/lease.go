// Package lease keeps an executor process's declarations alive: the one
// sender of declarations (protocol.DeclareRequest), used by executors and by
// tests and benchmarks that stand in for them.
//
// Each declaration is a lease. Dispatchers store it in the declaration
// bucket, whose age limit is protocol.LeaseTTL, and the keeper renews it
// every protocol.LeaseRenewal, so the declaration of a process that dies or
// is cut off disappears at most LeaseTTL after its last renewal; a process
// that stops cleanly withdraws its own at once. It imports protocol and
// nats.go only.
package lease

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// requestTimeout bounds one exchange with a dispatcher.
const requestTimeout = 2 * time.Second

// retryAfterFailure is how soon a failed renewal is tried again.
const retryAfterFailure = 500 * time.Millisecond

// RefusedError says a dispatcher refused some declarations: another team
// owns the name, the team has too many, or their tool text breaks a bound
// (protocol.ValidateToolText).
type RefusedError struct {
	Refusals []protocol.Refusal
}

// Owned reports whether a refusal is of a name another team owns.
func (e *RefusedError) Owned() bool {
	return slices.ContainsFunc(e.Refusals, func(r protocol.Refusal) bool { return r.Owner != "" })
}

func (e *RefusedError) Error() string {
	parts := make([]string, len(e.Refusals))
	for i, r := range e.Refusals {
		parts[i] = r.Function + ": " + r.Reason
	}
	return "lease: declarations refused: " + strings.Join(parts, "; ")
}

// Keeper holds the declarations of one process of a team.
type Keeper struct {
	nc    *nats.Conn
	team  string
	log   *slog.Logger
	serve []byte // the encoded DeclareRequest, renewed as it is
	stop  []byte // its withdrawal
	every time.Duration
	// unanswered: no dispatcher answered the first declaration, so the
	// first renewal comes soon.
	unanswered bool
	// failing: renewals fail (logged once, when they start to).
	failing bool
}

// Declare sends every declaration once and returns the keeper that renews
// them. A refusal is a *RefusedError, returned with the keeper so that what
// was accepted can be withdrawn. No dispatcher answering is not an error:
// none may be running yet, and the keeper's renewals reach the first that
// starts. Nor is a dispatcher's failure to store them: the keeper sends
// them again, as the protocol says.
func Declare(ctx context.Context, nc *nats.Conn, team string, decls []*protocol.Declaration, log *slog.Logger) (*Keeper, error) {
	if log == nil {
		log = slog.Default()
	}
	req := protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareServe}
	for _, d := range decls {
		req.Declarations = append(req.Declarations, *d)
	}
	serve, err := protocol.EncodeDeclareRequest(team, &req)
	if err != nil {
		return nil, err
	}
	req.Op = protocol.DeclareWithdraw
	stop, _ := json.Marshal(&req)
	k := &Keeper{nc: nc, team: team, log: log, serve: serve, stop: stop, every: protocol.LeaseRenewal}
	err = k.send(ctx, k.serve)
	var failed *dispatcherError
	switch {
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		log.Warn("no dispatcher answered this executor's declarations; declaring again until one does", "err", err)
	case errors.As(err, &failed):
		// The protocol's "send it again": the dispatcher could not write
		// the registry (a cluster electing a leader, say), which a later
		// declaration can.
		log.Warn("a dispatcher could not store this executor's declarations; declaring again until one does", "err", err)
	default:
		return k, err
	}
	k.unanswered = true
	return k, nil
}

// dispatcherError is a reply whose error says the request as a whole
// failed on the dispatcher's side; the protocol says to send it again.
type dispatcherError struct{ msg string }

func (e *dispatcherError) Error() string { return "lease: declare: dispatcher: " + e.msg }

// send makes one exchange with a dispatcher.
func (k *Keeper) send(ctx context.Context, body []byte) error {
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	m, err := k.nc.RequestWithContext(rctx, protocol.DeclareSubject(k.team), body)
	if err != nil {
		return fmt.Errorf("lease: declare: %w", err)
	}
	reply, err := protocol.DecodeDeclareReply(m.Data)
	if err != nil {
		return fmt.Errorf("lease: declare: %w", err)
	}
	if reply.Error != "" {
		return &dispatcherError{msg: reply.Error}
	}
	if len(reply.Refused) > 0 {
		return &RefusedError{Refusals: reply.Refused}
	}
	return nil
}

// Renew sends the declarations once now.
func (k *Keeper) Renew(ctx context.Context) error { return k.send(ctx, k.serve) }

// Run renews the declarations every protocol.LeaseRenewal until ctx ends.
// A renewal that fails is logged and tried again a second later: while it
// fails, the declarations lapse and the dispatchers count this process out,
// as they should for a process they cannot hear from.
func (k *Keeper) Run(ctx context.Context) {
	first := k.every
	if k.unanswered {
		first = retryAfterFailure
	}
	t := time.NewTimer(first)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := k.send(ctx, k.serve)
		next := k.every
		var refused *RefusedError
		switch {
		case ctx.Err() != nil:
		case errors.As(err, &refused):
			k.log.Error("dispatchers refuse declarations of this executor; no calls of them will arrive", "err", err)
		case err != nil:
			// Logged once per outage: while no dispatcher answers the
			// renewal is retried often, and quietly.
			if !k.failing {
				k.log.Warn("renewing this executor's declarations failed; retrying until a dispatcher answers", "err", err)
			}
			k.failing = true
			next = retryAfterFailure
		case k.failing || k.unanswered:
			k.log.Info("a dispatcher has this executor's declarations again")
			k.failing, k.unanswered = false, false
		}
		t.Reset(next)
	}
}

// Withdraw removes the declarations, so dispatchers stop counting this
// process at once instead of when its leases lapse.
func (k *Keeper) Withdraw(ctx context.Context) error {
	if err := k.send(ctx, k.stop); err != nil {
		return fmt.Errorf("lease: withdraw: %w", err)
	}
	return nil
}
