package dispatch

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// What an operator may do with names (dispatcher functions reserve,
// transfer, release), on the buckets directly, as the dispatcher's NATS
// user. Each applies to a name and every name that reads as it
// (protocol.CanonicalFunctionName).

// ErrNameOwned is returned by ReserveName for a name another team owns.
var ErrNameOwned = errors.New("dispatch: the name is owned by another team")

// byOperator is the By of the names entries an operator writes.
const byOperator = "operator"

// ReserveName reserves name for team: no other team may claim it or a name
// that reads as it, and it is not released while nobody serves it, until
// ReleaseName. It wraps ErrNameOwned when another team owns it (see
// TransferName).
func ReserveName(ctx context.Context, js jetstream.JetStream, name, team string) error {
	return putNameAs(ctx, js, name, team, false)
}

// TransferName makes team the owner of name and of the names that read as
// it, reserved as ReserveName does: the claim of name passes to team with
// its definition, claims of other teams of names that read as it are
// removed, and the previous owner's executors are refused from their next
// renewal.
func TransferName(ctx context.Context, js jetstream.JetStream, name, team string) error {
	return putNameAs(ctx, js, name, team, true)
}

// ReleaseName frees name and the names that read as it at once: their
// claims and their canonical entry are removed, reserved or not. A name
// still served is claimed again by its team's next renewal.
func ReleaseName(ctx context.Context, js jetstream.JetStream, name string) error {
	if err := protocol.ValidateFunctionName(name); err != nil {
		return err
	}
	names, claims, err := nameBuckets(ctx, js)
	if err != nil {
		return err
	}
	c := protocol.CanonicalFunctionName(name)
	if err := names.Purge(ctx, c); err != nil {
		return fmt.Errorf("dispatch: release %s: %w", c, err)
	}
	return eachClaimOf(ctx, claims, c, func(e jetstream.KeyValueEntry, _ *protocol.FunctionSpec) error {
		return claims.Purge(ctx, e.Key(), jetstream.LastRevision(e.Revision()))
	})
}

func putNameAs(ctx context.Context, js jetstream.JetStream, name, team string, transfer bool) error {
	if err := protocol.ValidateFunctionName(name); err != nil {
		return err
	}
	if err := protocol.ValidateTeamName(team); err != nil {
		return err
	}
	names, claims, err := nameBuckets(ctx, js)
	if err != nil {
		return err
	}
	c := protocol.CanonicalFunctionName(name)
	data, err := protocol.EncodeNameClaim(&protocol.NameClaim{Version: protocol.Version, Team: team, Reserved: true, By: byOperator, UpdatedAt: time.Now().UTC()})
	if err != nil {
		return err
	}
	owned := func(owner string) error {
		return fmt.Errorf("%w: %s (as %s) is team %q's; transfer it to move it", ErrNameOwned, name, c, owner)
	}
	if !transfer {
		if err := eachClaimOf(ctx, claims, c, func(_ jetstream.KeyValueEntry, s *protocol.FunctionSpec) error {
			if s.Team != team {
				return owned(s.Team)
			}
			return nil
		}); err != nil {
			return err
		}
	}
	for range claimTries {
		e, err := names.Get(ctx, c)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			_, err = names.Create(ctx, c, data)
		case err != nil:
		default:
			var cur *protocol.NameClaim
			if cur, err = protocol.DecodeNameClaim(e.Value()); err == nil && cur.Team != team && !transfer {
				return owned(cur.Team)
			}
			_, err = names.Update(ctx, c, data, e.Revision())
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return fmt.Errorf("dispatch: reserve %s: %w", c, err)
		}
		if !transfer {
			return nil
		}
		return eachClaimOf(ctx, claims, c, func(e jetstream.KeyValueEntry, s *protocol.FunctionSpec) error {
			switch {
			case s.Team == team:
				return nil
			case e.Key() != name:
				return claims.Purge(ctx, e.Key(), jetstream.LastRevision(e.Revision()))
			}
			s.Team, s.UpdatedAt = team, time.Now().UTC()
			b, err := protocol.EncodeFunctionSpec(s)
			if err == nil {
				_, err = claims.Update(ctx, e.Key(), b, e.Revision())
			}
			return err
		})
	}
	return fmt.Errorf("dispatch: reserve %s: it kept changing; try again", c)
}

func nameBuckets(ctx context.Context, js jetstream.JetStream) (names, claims jetstream.KeyValue, err error) {
	if names, err = js.KeyValue(ctx, protocol.NameBucket); err != nil {
		return nil, nil, fmt.Errorf("dispatch: open %s (has a dispatcher of this version run?): %w", protocol.NameBucket, err)
	}
	if claims, err = js.KeyValue(ctx, protocol.RegistryBucket); err != nil {
		return nil, nil, fmt.Errorf("dispatch: open %s: %w", protocol.RegistryBucket, err)
	}
	return names, claims, nil
}

// eachClaimOf calls fn with each claim of a name of the canonical form c.
func eachClaimOf(ctx context.Context, claims jetstream.KeyValue, c string, fn func(jetstream.KeyValueEntry, *protocol.FunctionSpec) error) error {
	l, err := claims.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("dispatch: list the claims: %w", err)
	}
	var matching []string
	for k := range l.Keys() {
		if protocol.CanonicalFunctionName(k) == c {
			matching = append(matching, k)
		}
	}
	_ = l.Stop()
	for _, k := range matching {
		e, err := claims.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("dispatch: read the claim of %s: %w", k, err)
		}
		s, err := protocol.DecodeFunctionSpec(e.Value())
		if err != nil {
			return fmt.Errorf("dispatch: read the claim of %s: %w", k, err)
		}
		if err := fn(e, s); err != nil {
			return fmt.Errorf("dispatch: %s: %w", k, err)
		}
	}
	return nil
}
