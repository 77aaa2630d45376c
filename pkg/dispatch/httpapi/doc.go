// Package httpapi is the dispatcher's HTTP front door: the watch API, the
// inspection API, signed platform webhooks, the tool export, definition
// acceptance, approvals and the audit trail, the MCP server at /mcp, health checks, and the guard that
// decides who may ask for what (bearer tokens, or loopback clients only).
//
// It holds no state of its own and reaches the turn engine only through
// package dispatch's exported API: [New] wraps a [dispatch.Dispatcher].
//
//	POST /v1/watch       start driving a platform object (202; 400 naming the field,
//	                     or 404 naming it when the platform has no such object)
//	GET  /v1/watch/{id}  the watch, its turns and each call's result
//	GET  /v1/turns, /v1/turns/{key}, /v1/turns/stream, /v1/functions,
//	     /v1/watches     the inspection API (inspect.go)
//	GET  /v1/tools       the served functions as a platform's tool definitions
//	POST /v1/functions/{name}/accept
//	                     an admin accepts a function's changed definition
//	GET  /v1/approvals, /v1/approvals/{call_key}; POST /v1/approvals/{call_key}/approve|deny
//	                     calls held for approval, and deciding them (approvals.go)
//	GET  /v1/audit       the audit trail as JSON lines (approvals.go)
//	POST /webhooks/openai signed platform webhooks (401 unless verified)
//	GET  /healthz        200 while the process runs
//	GET  /readyz         200 once NATS is connected and everything is provisioned
//	/mcp                 the MCP front door: Streamable HTTP, stateless (mcp.go);
//	                     notifications/cancelled from any replica (mcpcancel.go);
//	                     tasks of protocol 2025-11-25 (mcptasks.go) and the
//	                     Tasks extension of 2026-07-28 (mcptasksext.go)
//	GET  /.well-known/oauth-protected-resource[/mcp]
//	                     with tokens, the RFC 9728 metadata of /mcp (oauth.go)
//
// # Callers
//
// Everything under /v1 (and /mcp and /ui) needs a caller: with
// [Options.Authenticator] set, a known bearer token (else 401 with
// WWW-Authenticate: Bearer, naming /mcp's protected-resource metadata on
// /mcp, as MCP clients expect); without it, a loopback client (else 401).
// The guard puts the [dispatch.Caller] in the request's context
// ([CallerOf]); a caller scoped to some teams sees only their functions,
// calls and watches, and gets 403 for what is only other teams'. Handlers
// served beside this one (the console) use the same rules through
// [Handler.Guard]. Without an Authenticator the guard also refuses, on
// every route but the webhook, what a web page could make a browser on the
// dispatcher's host send (browser.go). GET /metrics, when [Options.Metrics]
// is set, is for admins (or loopback clients) only.
//
// # Limits
//
// /mcp takes one JSON-RPC message per POST (a batch is a JSON-RPC error);
// a message it cannot take gets the JSON-RPC error the specification names
// (-32601 for an unknown method), with the request's id.
// Each caller may have [Options.MaxMCPCallsPerCaller] tools/call running
// and [Options.MaxStreamsPerCaller] event streams open. Serve the handler
// with [NewServer], whose [Timeouts] cut off clients that send or read too
// slowly.
//
// # Errors
//
// Every error is JSON: {"error":{"message":"...","field":"..."}}, field
// naming the request's field or query parameter when one is at fault.
// 503 answers carry Retry-After: 1; until the dispatcher is ready (and
// once it stops) every route but the health checks answers 503.
package httpapi
