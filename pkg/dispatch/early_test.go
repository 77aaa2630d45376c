package dispatch_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A young turn's calls go out while its record is written, so its results
// can come back before the record is stored. They are held, not
// acknowledged, until the write ends: stored, they count (and complete
// the turn); stored by another intake, they go to whoever gathers for it;
// not stored, they are delivered again, for the intake's retry to gather.
// Acknowledging and dropping them instead would leave the turn waiting
// for the sweep's re-check (15 s at the soonest) or its deadline.
func TestResultsOfAYoungTurnWaitForItsRecord(t *testing.T) {
	for _, c := range []struct {
		name string
		// write stores the record (or not) and settles the early intake.
		write func(ctx context.Context, d *dispatch.Dispatcher, turn *dispatch.Turn) error
	}{
		{"stored", func(ctx context.Context, d *dispatch.Dispatcher, turn *dispatch.Turn) error {
			rev, err := dispatch.StoreRecord(ctx, d, turn)
			dispatch.Settle(ctx, d, turn.Key, rev, err)
			return err
		}},
		{"stored by another intake", func(ctx context.Context, d *dispatch.Dispatcher, turn *dispatch.Turn) error {
			if _, err := dispatch.StoreRecord(ctx, d, turn); err != nil {
				return err
			}
			dispatch.Settle(ctx, d, turn.Key, 0, dispatch.ErrConflict)
			if dispatch.Tracking(d, turn.Key) {
				return errors.New("still gathering for a turn another intake took in")
			}
			return nil
		}},
		{"not stored, then retried", func(ctx context.Context, d *dispatch.Dispatcher, turn *dispatch.Turn) error {
			dispatch.Settle(ctx, d, turn.Key, 0, errors.New("no answer from the server"))
			if dispatch.Tracking(d, turn.Key) {
				return errors.New("still gathering for a turn whose record was not stored")
			}
			rev, err := dispatch.StoreRecord(ctx, d, turn)
			if err == nil {
				dispatch.Track(d, turn, rev)
			}
			return err
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			e.register("geo", "get_weather", weatherSchema)
			ran := e.serve("geo", []string{"get_weather"}, func(*protocol.Call) (string, bool) { return "sunny", false })
			d, _ := e.dispatcher(dispatch.Options{})
			testutil.WaitFor(t, 10*time.Second, func() bool { return dispatch.LiveSchemas(d, "get_weather") == 1 })
			ctx := context.Background()
			req := &dispatch.TurnRequest{
				Ref: dispatch.Ref{Platform: protocol.PlatformMCP}, Scope: "mcp/early", CreatedAt: time.Now(),
				Calls: []dispatch.CallRequest{{ID: "call_1", Name: "get_weather", Arguments: []byte(`{"location":"Oslo"}`)}},
			}
			turn, err := dispatch.EarlyIntake(ctx, d, req)
			if err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 10*time.Second, func() bool { return dispatch.HeldResults(d, turn.Key) == 1 })
			if _, err := d.Turn(ctx, turn.Key); !errors.Is(err, dispatch.ErrNotFound) {
				t.Fatalf("before its record is written the turn reads %v, want not found", err)
			}
			if err := c.write(ctx, d, turn); err != nil {
				t.Fatal(err)
			}
			// Well within the sweep's first re-check (stuckAfter, 15 s).
			testutil.WaitFor(t, 8*time.Second, func() bool {
				got, err := d.Turn(ctx, turn.Key)
				return err == nil && got.State == dispatch.TurnSubmitted
			})
			got, _ := d.Turn(ctx, turn.Key)
			if got.CutOff || len(got.TimedOut) > 0 {
				t.Errorf("the turn was cut off (timed out %v), want it closed by its result", got.TimedOut)
			}
			if n := ran.Load(); n != 1 {
				t.Errorf("the call ran %d times, want once", n)
			}
		})
	}
}
