// Package dispatch is toolrelay's dispatcher: it turns the function calls an
// agent platform waits for into calls on NATS JetStream, gathers their
// results and submits each turn to the platform exactly once, before the
// run expires.
//
// # Turns
//
// A turn is one required action: the calls a model asked for in one go.
// [Dispatcher.Intake] records it in a KV bucket by compare-and-set (the
// same action seen by webhook, event stream and poll, on any replica, is one
// turn), arms a deadline timer as a JetStream scheduled message, validates
// each call's arguments against the function's JSON Schema and publishes
// one message per call to fncall.<team>.<function>. Calls that cannot work —
// an unknown function, bad arguments, a function no executor serves — get a
// failed result at once and run nowhere. A call taken in whose function
// then loses its last executor (withdrawn, or its declaration lapsed) fails
// as unavailable once [Options.ServeGrace] has passed without one back (10 s
// after a declaration lapsed: a failover holds live executors' renewals
// back).
//
// A turn moves collecting → submitting → submitted | failed, only by
// compare-and-set, and one concept decides which replica submits it: a
// lease on its record (owner, until, a fencing epoch), acquired by the
// replica that takes the turn in, renewed before any submission attempt
// with little of it left, taken over by another replica only once it has
// lapsed, released when the replica stops. A turn whose results are all in
// while its intake lease holds is submitted with no write before; any
// other submission first writes the record as submitting under the lease.
// In a process, every event of a turn is handled by one goroutine at a
// time (package internal/lifecycle). docs/turns.md has the model, who
// writes each transition and the windows it leaves.
//
// When its deadline comes first, the turn is submitted with the results
// it has and a "timed out" failure for each straggler; late
// results are recorded, never submitted. A submission repeated after a
// crash carries the same ids and idempotency keys, and the platform's
// "already submitted" answer counts as success.
//
// # Approvals
//
// A function may declare an approval policy (protocol.ApprovalPolicy,
// evaluated by package approval): its calls, or those a CEL condition over
// their arguments picks, are held at intake instead of published. A held
// call's record (an [Approval], in the approval bucket, written before the
// turn's) waits as awaiting_approval while the turn's other calls run; it
// is announced on protocol.ApprovalRequestedSubject and armed with an
// auto-deny timer, a scheduled message as a turn's deadline is, firing
// the function's timeout (at least [MinApprovalRunWindow]) before the
// turn's deadline. [Dispatcher.Decide] moves it once, by compare-and-set:
// approved, the call is published as intake would have published it;
// denied, or not decided in time, it fails with protocol.CodeDenied and a
// message naming who and why. Decisions reach the turn as the events it
// has anyway (a call published, a result recorded): they never write the
// turn's record. [Dispatcher.Approvals] lists held calls, and
// [Dispatcher.Audit] reads the audit trail: every request, decision and
// result of a side-effecting function (docs/approvals.md).
//
// A Responses mcp_approval_request ([CallRequest].MCPServer) is a call the
// dispatcher decides itself by the same policy: that of the function it
// names when its server is the fleet's own ([Options].MCPServerLabels),
// an admin's otherwise; held, it is an [Approval] like any held call, and
// its result is the decision, which the adapter answers as an
// mcp_approval_response.
//
// # Platforms
//
// [Platform] is the small interface a platform adapter implements, and
// [WebhookVerifier] the one that authenticates a platform's webhooks. The
// engine knows no platform's SDK: package openaiplatform (New, Webhooks)
// holds the adapters of OpenAI Agents sessions, OpenAI and Azure Assistants
// runs and the Responses API (and Microsoft Foundry agents) over one
// openai-go client. A [Watch] drives a platform object the
// dispatcher cannot learn of by webhook: it polls it (and follows its event
// stream where there is one), takes in each required action and, for
// Responses, follows each continuation. The engine keeps watches' records
// ([Dispatcher.WatchStatus]) and answers the watch API; the driving is
// package watch's, which the engine reaches through [WatchDriver]:
//
//	d, err := dispatch.New(js, platforms, opts)
//	...
//	watch.New(d, js) // without it, d drives no watches (ErrNoWatchDriver)
//
// # Front doors
//
// This package is the turn engine. What reaches it from outside goes
// through its exported API only, from packages of its own:
//
//   - package httpapi serves the HTTP API: the watch API
//     ([Dispatcher.AnswerWatchRequest], [Dispatcher.AnswerWatchStatus]),
//     the inspection API (the Inspect methods and [Dispatcher.FollowTurns]),
//     signed webhooks ([Dispatcher.TakeInWebhook]), the tool export
//     ([Dispatcher.ServedFunctions]), definition acceptance
//     ([Dispatcher.AcceptDefinition]), the approval and audit API
//     ([Dispatcher.Approvals], [Dispatcher.Decide], [Dispatcher.Audit]),
//     the MCP server at /mcp, health
//     checks ([Dispatcher.Ready], [Dispatcher.Connected]), and the guard
//     that authenticates each [Caller];
//   - package tooldef renders served functions as a platform's tool
//     definitions (GET /v1/tools, the dispatcher command's tools command);
//   - package watch drives watches: it starts each ([Dispatcher.Watch]
//     through [WatchDriver]), polls its object, takes in its turns,
//     waits for them to close ([Dispatcher.AwaitClosed]), cancels them
//     when the platform ends the run ([Dispatcher.CancelTurn]), takes up a
//     turn a stopped driver listed ([Dispatcher.Resume]), hands its
//     watches over when the dispatcher stops and takes over those of
//     replicas that stopped, and serves the watch API on NATS;
//   - package internal/console, the operator console, reads the Inspect
//     methods beside it.
//
// The MCP server is the fleet as a remote MCP server (a protocol the
// dispatcher serves, not a platform it drives). Each tools/call is a
// direct call ([Dispatcher.Call]): a turn of one call of the
// pseudo-platform "mcp" ([protocol.PlatformMCP]), taken in, validated,
// fanned out, timed and gathered like any other, whose submission is the
// answer to the waiting request. Any replica may gather it; the one
// holding the request learns the outcome from the turn record. A client
// may cancel it from any replica ([Dispatcher.CancelCall]: every replica
// is told on NATS, the one running the call ends it). A started call (an
// MCP task) is a direct call nobody waits for: [Dispatcher.StartCall]
// returns once its turn is recorded, and any replica reads it
// ([Dispatcher.StartedCall]) or cancels it ([Dispatcher.CancelStartedCall])
// by its turn key. The turn record is all there is of it, but for an
// entry naming it under its client in the task index, which
// [Dispatcher.StartedCalls] lists.
//
// The watch API is also served on NATS (protocol.WatchSubject and
// protocol.WatchStatusSubject) by package watch while [Dispatcher.Run]
// serves, with the same answers.
//
// # Replicas and crashes
//
// Everything that must survive lives in JetStream, so any number of
// dispatchers can share one NATS: results are consumed through one durable
// consumer (a replica with news of a turn another owns tells the owner),
// and a sweep on every replica repairs what a dead one left (turns past
// their deadline, complete but not closed, or whose owner's lease lapsed;
// through the [WatchDriver], watches whose driver went silent). A replica
// that stops cleanly releases its leases and the watches it drove, so the
// others take them at once.
//
// # Errors
//
// Intake and Watch return errors for bad input ([FieldError] names the
// field) and for JetStream failures; Watch also refuses an object the
// platform says does not exist ([ErrObjectNotFound], in a [FieldError]
// naming the field), and returns [ErrNoWatchDriver] when no [WatchDriver]
// is attached. Platform errors are classified as [PlatformError] and
// retried (408, 409, 429, 5xx, transport) with backoff that honours
// Retry-After until the run expires. A call's failure reaches the
// model as a result, never as an error here.
//
// # Observability
//
// Every turn is one trace (turn, a PRODUCER span per call, the executors'
// CONSUMER spans, the submission), parented by the traceparent of the watch
// request or webhook when there is one; metrics answer whether turns make
// the window (time left at submission) and which function is slow or
// failing. [Options] takes the providers; the globals are the default.
//
// What is happening now — open turns and their deadlines, recently closed
// turns, functions and their executors, watches — is read from an index
// each replica keeps of the turn and watch buckets, built on first use and
// kept current by following them: [Dispatcher.InspectTurns],
// [Dispatcher.InspectTurn], [Dispatcher.InspectFunctions] and
// [Dispatcher.InspectWatches] (and [Dispatcher.FollowTurns] for the
// changes), served as GET /v1/turns (and its event stream), /v1/functions
// and /v1/watches by package httpapi, and read by the console
// (internal/console) and the dispatcher command's inspection commands.
// What lives in a team's own account (its call stream's consumers: the
// functions' queue figures; its dead letters) is read through
// [Dispatcher.TeamJetStream], which with [Options.TeamAPIPrefix] reaches
// each team's account over the read-only paths dispatcher nats-config
// writes; [Dispatcher.Teams] lists the teams to read.
//
// # Glossary
//
// One meaning per word, in this package and its documentation:
//   - turn: the calls a model asked for in one go, submitted together.
//   - record: a turn's entry in the turn bucket.
//   - lease: the right to submit a turn and write its record (owner,
//     until, epoch); owner: the process instance holding it; take over:
//     acquire a lease that lapsed; release: give one up (a function
//     name's claim is removed, never released, but for the CLI's
//     `dispatcher functions release`, the contract's word). (Package
//     protocol, the executors' contract, calls a declaration's time to
//     live its lease, protocol.LeaseTTL; here a declaration lapses.)
//   - cut-off: closing a turn at its deadline with a "timed out" failure
//     for each call without a result.
//   - claim (of a function name): the registry's record of which team owns
//     a function; never used of turns, but of the turn records of the
//     version before the lease, which record.go still reads. Removed
//     when nobody has served it for Options.ClaimGrace.
//   - canonical name: the form that makes names that read alike one name
//     for ownership (protocol.CanonicalFunctionName), owned in the names
//     bucket before a name of that form is claimed.
//   - timer: a turn's deadline, a scheduled message; the timer subjects
//     also list the open turns for the sweep (the timer index).
//   - index: never alone, always one of: the inspection index, the
//     in-memory view of the turn and watch buckets the inspection API
//     reads; the timer index, above; the task index, the task bucket's
//     entries naming each client's started calls; the registry's
//     indexes, its in-memory lookups of claims by owner and canonical
//     name; the response index, the watch driver's map of the responses
//     it drives to their watches.
//   - roll-up marker: the message that removes a closed turn's timer.
//   - watch: the dispatcher driving a platform object it cannot learn of
//     by webhook ([Watch]); never a KV watcher, which this documentation
//     calls following or mirroring a bucket.
//   - driver: the goroutine of the replica that drives a watch; watch
//     driver ([WatchDriver]): what runs the drivers of a replica
//     (package watch), attached to its Dispatcher.
//   - intake: taking a turn in (its record, timer and calls); channel:
//     how intake heard of it ([TurnRequest] Channel: a webhook, a
//     watch's poll or event stream, an MCP call).
//   - direct call: a call a client waits for on an open request (an MCP
//     tools/call), run as a turn of one call ([Dispatcher.Call]); started
//     call: one its client reads later (an MCP task,
//     [Dispatcher.StartCall]); handle: what names a direct call for its
//     client's cancellation (its caller and request id).
//   - declaration: an executor process's announcement of a function it
//     serves, an entry of the declaration bucket that lapses unless the
//     process renews it (live: not lapsed); definition: a
//     function's description and schema, what the model reads
//     ([DefinitionDigest]).
//   - caller: who asks the dispatcher for something, and which teams it
//     sees ([Caller]); scope: those teams.
//   - front door: a package that serves the engine to the outside
//     through its exported API only (httpapi, tooldef, watch).
//   - held call: a call its function's approval policy keeps from
//     executors until a person decides it; approval: its record and
//     decision; auto-deny: denying it undecided, in time for the deadline.
//   - MCP approval request: a Responses mcp_approval_request, decided by
//     the dispatcher like a held call; grant: a person's approval of one,
//     kept for the MCP call of the fleet's /mcp that follows it.
//   - audit trail: the stream of approval requests, decisions and runs of
//     side-effecting functions, kept for Options.AuditRetention.
package dispatch
