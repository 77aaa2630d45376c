// Package watch drives a dispatcher's watches: platform objects the
// dispatcher cannot learn of by webhook (an Agents session, an Assistants
// run, a Responses response or conversation), which it polls (and follows
// by event stream where there is one), taking in each required action as
// a turn and, for Responses, following each continuation, until the
// object is done, fails, or MaxSteps turns were driven.
//
// It is a front door of the turn engine (package dispatch) and uses its
// exported API only. [New] attaches a [Service] to a Dispatcher, the one
// line an embedder needs for watches:
//
//	d, err := dispatch.New(js, platforms, opts)
//	...
//	watch.New(d, js) // d.Watch, POST /v1/watch and the NATS watch subjects now drive watches
//	err = d.Run(ctx)
//
// Without it the dispatcher drives no watches: Dispatcher.Watch returns
// dispatch.ErrNoWatchDriver and POST /v1/watch answers 501.
//
// # Drivers and replicas
//
// A driver is the goroutine of the replica that drives one watch. It
// saves the watch's record every 20 s, naming its replica, and steps
// aside when it finds another replica named there. While Run serves, the
// Service answers on the replica's presence subject and serves the watch
// API on NATS (protocol.WatchSubject, protocol.WatchStatusSubject, the
// same answers as POST /v1/watch and GET /v1/watch/{id}). When the
// dispatcher stops, its drivers stop at once and release their watches,
// so another replica's sweep drives them at once; a watch whose driver
// went silent for a minute, or whose replica does not answer on its
// presence subject (killed), is taken over too, by compare-and-set, so
// one replica drives it. A restarted replica resumes the watches it drove
// under the same name.
//
// A turn a driver takes in is listed on the watch before its intake, so a
// crash in between leaves the watch naming its turn; the next driver
// resumes that turn (dispatch.Dispatcher.Resume) rather than waiting for
// the sweep. While a turn is open the driver waits for it to close
// (dispatch.Dispatcher.AwaitClosed); if the platform ends the run
// meanwhile, it cancels the watch's open turns
// (dispatch.Dispatcher.CancelTurn) and fails the watch.
package watch
