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
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// requestTimeout bounds one exchange with a dispatcher.
const requestTimeout = protocol.DeclareWait

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

// Keeper holds the declarations of one process of a team. Its methods may
// be called concurrently.
type Keeper struct {
	nc   *nats.Conn
	team string
	log  *slog.Logger
	// sendMu orders the exchanges that change what is declared, so a
	// renewal read before a Suspend cannot land after its withdrawal.
	sendMu sync.Mutex
	// mu guards serve and held, which Suspend and Resume change while Run
	// renews.
	mu sync.Mutex
	// decls are all the process's declarations; held names those not
	// renewed now (Suspend).
	decls []protocol.Declaration
	held  map[string]bool
	serve [][]byte // the encoded DeclareRequests of those renewed; none: none
	stop  [][]byte // the withdrawal of all
	// withdrawn: Withdraw was called (under sendMu); nothing is sent again.
	withdrawn bool
	every     time.Duration
	// unanswered: no dispatcher answered the first declaration, so the
	// first renewal comes soon; since is when that began.
	unanswered bool
	since      time.Time
	// failing: renewals fail (logged once: at once after a dispatcher had
	// answered, after startQuiet when none has yet).
	failing bool
}

// startQuiet is how long an executor started before any dispatcher (in a
// deployment coming up, or a test) declares without a warning: a
// dispatcher starting takes seconds; one missing for longer is news.
const startQuiet = 15 * time.Second

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
	all := make([]protocol.Declaration, len(decls))
	for i, d := range decls {
		all[i] = *d
	}
	serve, err := encodeRequests(team, protocol.DeclareServe, all)
	if err != nil {
		return nil, err
	}
	stop, err := encodeRequests(team, protocol.DeclareWithdraw, all)
	if err != nil {
		return nil, err
	}
	k := &Keeper{nc: nc, team: team, log: log, decls: all, held: map[string]bool{},
		serve: serve, stop: stop, every: protocol.LeaseRenewal}
	err = k.sendAll(ctx, k.serve)
	var failed *dispatcherError
	switch {
	case errors.Is(err, nats.ErrNoResponders) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
		log.Info("no dispatcher answered this executor's declarations yet; declaring again until one does", "err", err)
	case errors.As(err, &failed):
		// The protocol's "send it again": the dispatcher could not write
		// the registry (a cluster electing a leader, say), which a later
		// declaration can.
		log.Warn("a dispatcher could not store this executor's declarations; declaring again until one does", "err", err)
	default:
		return k, err
	}
	k.unanswered, k.since = true, time.Now()
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

// sendAll makes one exchange per request, in order, and returns the
// first error other than a refusal, else the refusals joined. A request
// that fails does not keep the others from being sent: each declaration
// lapses on its own, and a slow answer to one request must not let the
// next requests' declarations lapse too.
func (k *Keeper) sendAll(ctx context.Context, bodies [][]byte) error {
	var refused *RefusedError
	var failed error
	for _, b := range bodies {
		if ctx.Err() != nil {
			return cmp.Or(failed, ctx.Err())
		}
		err := k.send(ctx, b)
		var r *RefusedError
		if !errors.As(err, &r) {
			if err != nil && failed == nil {
				failed = err
			}
			continue
		}
		if refused == nil {
			refused = &RefusedError{}
		}
		refused.Refusals = append(refused.Refusals, r.Refusals...)
	}
	switch {
	case failed != nil:
		return failed
	case refused != nil:
		return refused
	}
	return nil
}

// encodeRequests encodes decls as requests of op, as few as the protocol's
// bounds allow: at most protocol.MaxDeclarations declarations, and
// protocol.MaxEnvelopeSize bytes, each. An executor of thousands of
// functions, or of a few with large schemas, declares them in several.
func encodeRequests(team string, op protocol.DeclareOp, decls []protocol.Declaration) ([][]byte, error) {
	// What a request takes beyond its declarations, and the comma
	// between two, generously.
	const overhead = 256
	var out [][]byte
	var batch []protocol.Declaration
	size := overhead
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		b, err := protocol.EncodeDeclareRequest(team, &protocol.DeclareRequest{Version: protocol.Version, Op: op, Declarations: batch})
		if err != nil {
			return err
		}
		out, batch, size = append(out, b), nil, overhead
		return nil
	}
	for _, d := range decls {
		b, err := json.Marshal(&d)
		if err != nil {
			return nil, err
		}
		if len(batch) == protocol.MaxDeclarations || size+len(b)+1 > protocol.MaxEnvelopeSize {
			if err := flush(); err != nil {
				return nil, err
			}
		}
		batch, size = append(batch, d), size+len(b)+1
	}
	if err := flush(); err != nil {
		return nil, err
	}
	return out, nil
}

// Renew sends the declarations once now.
func (k *Keeper) Renew(ctx context.Context) error {
	k.sendMu.Lock()
	defer k.sendMu.Unlock()
	return k.renew(ctx)
}

func (k *Keeper) renew(ctx context.Context) error {
	serve := k.serving()
	if len(serve) == 0 || k.withdrawn {
		return nil
	}
	return k.sendAll(ctx, serve)
}

// serving returns the requests that renew the declarations not held
// back, or none if all are.
func (k *Keeper) serving() [][]byte {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.serve
}

// Suspend withdraws the declaration of function and stops renewing it
// until Resume: the process cannot serve it for now (its consumer is
// gone), and dispatchers must not count it. If the withdrawal does not
// reach a dispatcher, the declaration lapses with its lease.
func (k *Keeper) Suspend(ctx context.Context, function string) error {
	k.sendMu.Lock()
	defer k.sendMu.Unlock()
	withdraw, err := k.hold(function, true)
	if err != nil || withdraw == nil {
		return err
	}
	if err := k.send(ctx, withdraw); err != nil {
		return fmt.Errorf("lease: withdraw %s: %w", function, err)
	}
	return nil
}

// Resume declares function again at once and renews it from then on.
func (k *Keeper) Resume(ctx context.Context, function string) error {
	k.sendMu.Lock()
	defer k.sendMu.Unlock()
	if _, err := k.hold(function, false); err != nil {
		return err
	}
	return k.renew(ctx)
}

// hold marks function held back (or not) and re-encodes the renewal; it
// returns the withdrawal of function's declaration when holding it.
func (k *Keeper) hold(function string, held bool) (withdraw []byte, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	i := slices.IndexFunc(k.decls, func(d protocol.Declaration) bool { return d.Spec.Name == function })
	if i < 0 {
		return nil, fmt.Errorf("lease: no declaration of %s", function)
	}
	if k.held[function] == held {
		return nil, nil
	}
	if held {
		k.held[function] = true
	} else {
		delete(k.held, function)
	}
	var renewed []protocol.Declaration
	for _, d := range k.decls {
		if !k.held[d.Spec.Name] {
			renewed = append(renewed, d)
		}
	}
	if k.serve, err = encodeRequests(k.team, protocol.DeclareServe, renewed); err != nil {
		return nil, err
	}
	if !held {
		return nil, nil
	}
	one := protocol.DeclareRequest{Version: protocol.Version, Op: protocol.DeclareWithdraw, Declarations: []protocol.Declaration{k.decls[i]}}
	return json.Marshal(&one)
}

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
		err := k.Renew(ctx)
		next := k.every
		var refused *RefusedError
		switch {
		case ctx.Err() != nil:
		case errors.As(err, &refused):
			k.log.Error("dispatchers refuse declarations of this executor; no calls of them will arrive", "err", err)
		case err != nil:
			// Logged once per outage: while no dispatcher answers the
			// renewal is retried often, and quietly. Before any has
			// answered, only once startQuiet has passed.
			switch {
			case k.failing:
			case !k.unanswered:
				k.failing, k.since = true, time.Now()
				k.log.Warn("renewing this executor's declarations failed; retrying until a dispatcher answers; no calls arrive meanwhile", "err", err)
			case time.Since(k.since) >= startQuiet:
				k.failing = true
				k.log.Warn("no dispatcher has answered this executor's declarations yet; retrying until one does; no calls arrive meanwhile",
					"err", err, "for", time.Since(k.since).Round(time.Second))
			}
			next = retryAfterFailure
		case k.failing || k.unanswered:
			k.log.Info("a dispatcher has this executor's declarations again")
			k.failing, k.unanswered = false, false
		}
		t.Reset(next)
	}
}

// Withdraw removes the declarations, so dispatchers stop counting this
// process at once instead of when its leases lapse. Nothing is declared
// again after it.
func (k *Keeper) Withdraw(ctx context.Context) error {
	k.sendMu.Lock()
	defer k.sendMu.Unlock()
	k.withdrawn = true
	if err := k.sendAll(ctx, k.stop); err != nil {
		return fmt.Errorf("lease: withdraw: %w", err)
	}
	return nil
}
