// Package lease keeps an executor process's declarations alive in the
// declaration bucket: the one writer of declarations, used by executors
// and by tests and benchmarks that stand in for them.
//
// Each declaration is a lease. The bucket's age limit is
// protocol.LeaseTTL and the keeper renews every protocol.LeaseRenewal, so
// the declaration of a process that dies or is cut off disappears (the
// server removes it and tells watchers with a marker) at most LeaseTTL
// after its last renewal; a process that stops cleanly withdraws its own
// at once.
package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Keeper holds the declarations of one process.
type Keeper struct {
	kv    jetstream.KeyValue
	log   *slog.Logger
	keys  []string
	datas [][]byte
	every time.Duration
}

// Declare writes every declaration once and returns the keeper that renews
// them. A declaration that cannot be written is an error: the process must
// not serve what it has not declared. With a write error the keeper is
// returned too, so that what was written can be withdrawn.
func Declare(ctx context.Context, kv jetstream.KeyValue, decls []*protocol.Declaration, log *slog.Logger) (*Keeper, error) {
	if log == nil {
		log = slog.Default()
	}
	k := &Keeper{kv: kv, log: log, every: protocol.LeaseRenewal}
	for _, d := range decls {
		data, err := protocol.EncodeDeclaration(d)
		if err != nil {
			return nil, err
		}
		k.keys = append(k.keys, d.Key())
		k.datas = append(k.datas, data)
	}
	return k, k.renew(ctx)
}

func (k *Keeper) renew(ctx context.Context) error {
	var errs []error
	for i, key := range k.keys {
		if _, err := k.kv.Put(ctx, key, k.datas[i]); err != nil {
			errs = append(errs, fmt.Errorf("lease: declare %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}

// Run renews the declarations every protocol.LeaseRenewal until ctx ends.
// A renewal that fails is logged and tried again a second later: while it
// fails, the declarations lapse and the dispatchers count this process out,
// as they should for a process they cannot hear from.
func (k *Keeper) Run(ctx context.Context) {
	t := time.NewTimer(k.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, k.every)
		err := k.renew(rctx)
		cancel()
		next := k.every
		if err != nil && ctx.Err() == nil {
			k.log.Warn("renewing this executor's declarations failed; retrying", "err", err)
			next = time.Second
		}
		t.Reset(next)
	}
}

// Withdraw deletes the declarations, so dispatchers stop counting this
// process at once instead of when its leases lapse.
func (k *Keeper) Withdraw(ctx context.Context) error {
	var errs []error
	for _, key := range k.keys {
		if err := k.kv.Delete(ctx, key); err != nil {
			errs = append(errs, fmt.Errorf("lease: withdraw %s: %w", key, err))
		}
	}
	return errors.Join(errs...)
}
