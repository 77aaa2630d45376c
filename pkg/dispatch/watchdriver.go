package dispatch

import (
	"context"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// What the engine offers the driver of its watches (package watch), which
// it cannot import: the seam the driver attaches through, and the lifetime
// the driver's goroutines share with Run.

// WatchDriver drives the watches of one replica. Package watch is the
// driver: watch.New attaches one to a Dispatcher. Without one the
// dispatcher drives no watches: [Dispatcher.Watch] returns
// ErrNoWatchDriver, and the watch API answers 501.
type WatchDriver interface {
	// Watch starts driving ref and returns its record, as
	// [Dispatcher.Watch] documents.
	Watch(ctx context.Context, ref Ref) (*Watch, error)
	// Serve starts what the driver serves while Run serves (the watch API
	// on NATS, this replica's presence). Run calls it once the engine
	// serves, before it reports ready, and calls stop when its context
	// ends. An error stops Run.
	Serve(ctx context.Context) (stop func(), err error)
	// Sweep drives the watches whose driver stopped or went silent. Run
	// calls it after each sweep of the turns, with startup true the first
	// time.
	Sweep(ctx context.Context, startup bool)
	// Response returns the object that a response a watch drives belongs
	// to (its watch's current Ref), for the response.completed webhook; ok
	// is false when no watch drives that response.
	Response(ctx context.Context, responseID string) (ref Ref, ok bool, err error)
}

// AttachWatchDriver makes w the driver of d's watches. Call it once,
// before Run (watch.New does).
func (d *Dispatcher) AttachWatchDriver(w WatchDriver) { d.watchDriver.Store(&attached{w}) }

// attached holds the WatchDriver attached to a Dispatcher.
type attached struct{ WatchDriver }

// driver returns the attached WatchDriver, or nil.
func (d *Dispatcher) driver() WatchDriver {
	if a := d.watchDriver.Load(); a != nil {
		return a.WatchDriver
	}
	return nil
}

// Watch starts driving ref through the attached [WatchDriver] and returns
// its record, a snapshot: the driver goes on changing its own copy, which
// WatchStatus reads. Watching an object that is already watched returns
// the existing watch.
//
// The platform is asked for the object first (up to 5 s): if it answers
// 404, Watch returns a *FieldError wrapping ErrObjectNotFound and records
// nothing. Any other failure to read it (a 5xx, a 429, no answer) is no
// verdict: the watch starts, and its driver keeps polling and reports
// what the platform says. It returns ErrNoWatchDriver when no driver is
// attached and ErrNotRunning when the dispatcher is not ready.
func (d *Dispatcher) Watch(ctx context.Context, ref Ref) (*Watch, error) {
	w := d.driver()
	if w == nil {
		return nil, ErrNoWatchDriver
	}
	return w.Watch(ctx, ref)
}

// Options returns the options d runs with, each default filled in.
func (d *Dispatcher) Options() Options { return d.opts }

// Platform returns d's adapter of platform p, if d has one.
func (d *Dispatcher) Platform(p protocol.Platform) (Platform, bool) {
	a, ok := d.platforms[p]
	return a, ok
}

// Go runs f in the background while Run serves, and reports whether it
// did (false: Run is not serving, and f does not run). f's context ends
// ShutdownTimeout after Run's context does, so that work begun may
// finish; Run waits for f to return.
func (d *Dispatcher) Go(f func(ctx context.Context)) bool { return d.background(f) }

// UntilStop returns a copy of ctx that also ends as soon as Run's context
// does: for work started with [Dispatcher.Go] that stops at once when the
// dispatcher stops (polling, waiting), unlike a submission. Before Run it
// ends only with ctx. Call cancel when done with it.
func (d *Dispatcher) UntilStop(ctx context.Context) (_ context.Context, cancel context.CancelFunc) {
	return d.withRunContext(ctx)
}

// ReportUnsupported says that ref's object waits on (or ended on) items
// toolrelay does not serve: a warning naming the object and each item, and
// the toolrelay.platform.unsupported counter by platform and item type.
// Call it once per item and object: the counter counts what it is told.
func (d *Dispatcher) ReportUnsupported(ctx context.Context, ref Ref, items ...UnsupportedItem) {
	for _, it := range items {
		d.tel.unsupported.Add(ctx, 1, d.tel.sets.Add(attrPlatform.String(string(ref.Platform)), attrItemType.String(it.Type))...)
		d.log.WarnContext(ctx, "the platform waits on something toolrelay does not serve; answer it there, or the object will not move on",
			"object", ref.String(), "item_type", it.Type, "item_id", it.ID)
	}
}
