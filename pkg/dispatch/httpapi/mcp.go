package httpapi

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/toolrelay/toolrelay/internal/otelconv"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The MCP front door: /mcp serves the Model Context Protocol's Streamable
// HTTP transport, stateless, so any replica answers any request and no
// request needs the replica an earlier one reached (no Mcp-Session-Id).
//
// tools/list lists the functions live executors serve, of the teams the
// caller sees; tools/call runs one as a direct call
// ([dispatch.Dispatcher.Call]): the same path as a platform's call,
// answered on the request. The SDK's tool
// registry is not used: the tools are the live registry's, they change as
// executors come and go, and each caller sees its own teams' only, so the
// two methods are answered by a middleware reading the registry.

const (
	// mcpProgressEvery is how often a running tools/call reports progress
	// to a client that asked for it (sent a progressToken).
	mcpProgressEvery = 2 * time.Second
	// metaTeam names the owning team in a tool's _meta, and metaErrorType
	// the type of a failed call's error (invalid_arguments, timeout, ...)
	// in its result's.
	metaTeam      = "io.toolrelay/team"
	metaErrorType = "io.toolrelay/error_type"
)

// Span attribute keys: MCP's (OpenTelemetry semantic conventions for MCP)
// and the dispatcher's own.
const (
	attrMCPMethod = attribute.Key("mcp.method.name")
	attrCaller    = attribute.Key("toolrelay.caller")
	attrToolName  = otelconv.ToolName
	attrTeam      = otelconv.Team
	attrOutcome   = otelconv.Outcome
)

// mcpHandler returns the handler of /mcp.
func (a *Handler) mcpHandler() http.Handler {
	// The SDK logs every request's session at info (each request is one
	// in stateless mode): only its warnings and errors are worth keeping.
	sdkLog := slog.New(minLevel{a.log.With("component", "mcp").Handler(), slog.LevelWarn})
	srv := mcp.NewServer(&mcp.Implementation{Name: "toolrelay", Title: "toolrelay fleet", Version: fmt.Sprint(protocol.Version)},
		&mcp.ServerOptions{
			Instructions: "Functions served by the toolrelay fleet. Each call runs on an executor through JetStream, " +
				"under a deadline; a failed call is a tool error whose text says what to do differently.",
			Logger:       sdkLog,
			Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
		})
	srv.AddReceivingMiddleware(a.mcpTools)
	if err := a.addTaskMethods(srv); err != nil {
		a.log.Error("MCP tasks are not served", "err", err)
	}
	h := mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, &mcp.StreamableHTTPOptions{
		Stateless:                    true,
		Logger:                       sdkLog,
		PropagateRequestCancellation: true,
		// The SDK refuses a request that reaches a loopback address under
		// another host name (DNS rebinding: a web page steering a browser
		// at a local server). Without tokens loopback clients are trusted,
		// so that stays; with tokens a request needs one anyway, and a
		// reverse proxy on the same host (which sends the public name)
		// must get through.
		DisableLocalhostProtection: a.opts.Authenticator != nil,
	})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body []byte
		if r.Method == http.MethodPost {
			var ok bool
			if body, ok = readMCPBody(w, r); !ok {
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
		}
		jw := &jsonrpcErrors{ResponseWriter: a.streaming(w), body: body}
		// The SDK cuts a handler's context loose from its request for older
		// protocol versions; the request's own context, kept here, is what
		// tells a call that its client went away.
		ctx, msg := withMessage(context.WithValue(r.Context(), httpRequestKey{}, r.Context()), body, r.Header.Get("Mcp-Protocol-Version"))
		a.mcpCancelled(ctx, msg)
		h.ServeHTTP(jw, r.WithContext(ctx))
		jw.finish()
	})
}

// readMCPBody reads the body of a POST to /mcp, or answers with a JSON-RPC
// error and returns false: a body over the SDK's own bound, or a JSON-RPC
// batch (a JSON array). MCP has no batches since its 2025-06-18 revision;
// the SDK refuses them only from clients that say they speak it, and one
// POST of 4 MiB could hold 35,000 calls.
func readMCPBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, mcp.DefaultMaxRequestBodyBytes))
	if errors.As(err, new(*http.MaxBytesError)) {
		writeJSONRPCError(w, http.StatusRequestEntityTooLarge, nil, jsonrpc.CodeInvalidRequest,
			fmt.Sprintf("the request body is over %d bytes, the most /mcp reads", mcp.DefaultMaxRequestBodyBytes))
		return nil, false
	}
	if err != nil {
		return nil, false // the client went away mid-body: nobody reads an answer
	}
	if trimmed := bytes.TrimLeft(body, " \t\r\n"); len(trimmed) > 0 && trimmed[0] == '[' {
		writeJSONRPCError(w, http.StatusBadRequest, nil, jsonrpc.CodeInvalidRequest,
			"JSON-RPC batches are not accepted on /mcp (MCP has none since its 2025-06-18 revision): send one request per POST")
		return nil, false
	}
	return body, true
}

// writeJSONRPCError answers with a JSON-RPC error; id is the request's, or
// nil (JSON null) when it is not known.
func writeJSONRPCError(w http.ResponseWriter, status int, id json.RawMessage, code int64, message string) {
	writeJSON(w, status, map[string]any{"jsonrpc": "2.0", "id": id, "error": map[string]any{"code": code, "message": message}})
}

// jsonrpcErrors turns the SDK's plain-text refusals of a request it cannot
// take (an unknown method, a request without an id or params, a body that
// is not JSON) into the JSON-RPC errors the specification names, with the
// request's id: -32601, -32600 and -32700. The SDK writes these as HTTP 400
// text/plain for clients of protocol versions before 2026-07-28 (for
// later ones it writes JSON-RPC itself). Every other answer passes through
// untouched, streams included.
type jsonrpcErrors struct {
	http.ResponseWriter
	body    []byte // the request's
	held    bool   // a plain-text 400 is being held back
	heldMsg bytes.Buffer
}

// The SDK's messages for what it refuses before any handler runs: the
// texts of its internal jsonrpc2 errors and of a body it cannot parse.
var sdkRefusals = []struct {
	prefix string
	code   int64
}{
	{"JSON RPC not handled", jsonrpc.CodeMethodNotFound},
	{"invalid request", jsonrpc.CodeInvalidRequest},
	{"malformed payload", jsonrpc.CodeParseError},
}

func (j *jsonrpcErrors) WriteHeader(status int) {
	if status == http.StatusBadRequest && strings.HasPrefix(j.Header().Get("Content-Type"), "text/plain") {
		j.held = true
		return
	}
	j.ResponseWriter.WriteHeader(status)
}

func (j *jsonrpcErrors) Write(p []byte) (int, error) {
	if j.held {
		return j.heldMsg.Write(p)
	}
	return j.ResponseWriter.Write(p)
}

func (j *jsonrpcErrors) Flush() {
	if !j.held {
		http.NewResponseController(j.ResponseWriter).Flush()
	}
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (j *jsonrpcErrors) Unwrap() http.ResponseWriter { return j.ResponseWriter }

// finish writes a held-back refusal: as a JSON-RPC error when it is one
// the SDK makes of a request, else as it was.
func (j *jsonrpcErrors) finish() {
	if !j.held {
		return
	}
	msg := strings.TrimSpace(j.heldMsg.String())
	for _, r := range sdkRefusals {
		if strings.HasPrefix(msg, r.prefix) {
			var req struct {
				ID json.RawMessage `json:"id"`
			}
			_ = json.Unmarshal(j.body, &req) // a body that is not JSON has no id
			j.Header().Del("X-Content-Type-Options")
			writeJSONRPCError(j.ResponseWriter, http.StatusBadRequest, req.ID, r.code, msg)
			return
		}
	}
	j.ResponseWriter.WriteHeader(http.StatusBadRequest)
	_, _ = j.ResponseWriter.Write(j.heldMsg.Bytes())
}

type httpRequestKey struct{}

// minLevel drops the records of h below min.
type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}
func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevel) WithAttrs(a []slog.Attr) slog.Handler            { return minLevel{m.h.WithAttrs(a), m.min} }
func (m minLevel) WithGroup(name string) slog.Handler              { return minLevel{m.h.WithGroup(name), m.min} }

// methodListen is MCP's long-lived stream of notifications (2026-07-28).
const methodListen = "subscriptions/listen"

// mcpTools answers tools/list and tools/call from the live registry; other
// methods go to the SDK. A caller holding MaxStreamsPerCaller streams
// cannot open one more with subscriptions/listen.
func (a *Handler) mcpTools(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if err := tasksGate(ctx, method); err != nil {
			return nil, err
		}
		if method == methodListen {
			caller, _ := callerFrom(ctx)
			if !a.streams.acquire(caller.Name) {
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: a.streamsMessage(caller)}
			}
			defer a.streams.release(caller.Name)
			return next(ctx, method, req)
		}
		if method == "initialize" {
			res, err := next(ctx, method, req)
			if err != nil {
				return nil, err
			}
			return mcpInitialized(res), nil
		}
		if method == "server/discover" {
			res, err := next(ctx, method, req)
			if err != nil {
				return nil, err
			}
			return mcpDiscovered(res), nil
		}
		switch r := req.(type) {
		case *mcp.ListToolsRequest:
			if !a.d.Ready() {
				// Before the registry is loaded the list would be empty,
				// and a client may keep it: better it asks again.
				return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
					Message: "the dispatcher is starting or stopping; list the tools again shortly"}
			}
			var cursor string
			if r.Params != nil {
				cursor = r.Params.Cursor
			}
			res, err := a.mcpListTools(ctx, cursor)
			if err != nil || dialectFrom(ctx) != tasksExperimental {
				return res, err
			}
			return mcpToolsWithTasks(res)
		case *mcp.CallToolRequest:
			return a.mcpCallTool(ctx, r)
		}
		return next(ctx, method, req)
	}
}

// mcpToolsPage is the most tools one tools/list answers: a fleet of
// thousands of functions is listed in pages, each naming the next by its
// nextCursor.
const mcpToolsPage = 500

// mcpListTools lists, a page at a time, the functions the caller's teams
// own that live executors serve. A cursor is the last name of the page
// before (encoded, so clients keep it opaque): the next page starts after
// it, and a function that came or went meanwhile moves no other.
func (a *Handler) mcpListTools(ctx context.Context, cursor string) (*mcp.ListToolsResult, error) {
	after := ""
	if cursor != "" {
		name, err := base64.RawURLEncoding.DecodeString(cursor)
		if err != nil || protocol.ValidateFunctionName(string(name)) != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("invalid cursor %q: pass the nextCursor of a tools/list result, or none for the first page", cursor)}
		}
		after = string(name)
	}
	caller, _ := callerFrom(ctx)              // none: sees no team
	specs := a.d.ServedFunctions(caller.Sees) // by name
	res := &mcp.ListToolsResult{Tools: make([]*mcp.Tool, 0, min(len(specs), mcpToolsPage))}
	for _, s := range specs {
		if s.Name <= after || s.Format != nil {
			continue // a custom tool takes text, and MCP tools take JSON arguments
		}
		if len(res.Tools) == mcpToolsPage {
			res.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(res.Tools[len(res.Tools)-1].Name))
			break
		}
		res.Tools = append(res.Tools, mcpTool(s))
	}
	return res, nil
}

// mcpTool describes a function as an MCP tool. The registry knows whether
// a function has side effects: one that has is neither idempotent nor safe
// from destroying something; one that has not may be run again (retries
// do), so it is idempotent. Whether a function only reads, the registry
// does not know, so readOnlyHint stays false.
func mcpTool(s *protocol.FunctionSpec) *mcp.Tool {
	ann := &mcp.ToolAnnotations{IdempotentHint: !s.SideEffects}
	if s.SideEffects {
		destructive := true
		ann.DestructiveHint = &destructive
	}
	t := &mcp.Tool{Name: s.Name, Title: s.Title, Description: s.Description, InputSchema: s.Parameters, Annotations: ann,
		Meta: mcp.Meta{metaTeam: s.Team}}
	if len(s.OutputSchema) > 0 {
		t.OutputSchema = s.OutputSchema
	}
	for _, ic := range s.Icons {
		t.Icons = append(t.Icons, mcp.Icon{Source: ic.Src, MIMEType: ic.MIMEType, Sizes: ic.Sizes, Theme: mcp.IconTheme(ic.Theme)})
	}
	return t
}

// mcpCallTool runs a tools/call as a direct call. A tool the caller
// cannot see is unknown to it: a JSON-RPC error, as for a name nobody
// owns. Every failure of a known tool is a result with isError, its text
// the message the platforms get.
func (a *Handler) mcpCallTool(ctx context.Context, req *mcp.CallToolRequest) (mcp.Result, error) {
	p := req.Params
	caller, _ := callerFrom(ctx)
	if !a.mcpCalls.acquire(caller.Name) {
		return mcpError(protocol.CodeUnavailable, fmt.Sprintf("%s was not run: %s has %d calls running already, the most one caller may "+
			"(TOOLRELAY_MAX_MCP_CALLS_PER_CALLER). Wait for one to finish, then try again.", p.Name, caller.Name, a.opts.MaxMCPCallsPerCaller)), nil
	}
	defer a.mcpCalls.release(caller.Name)
	f, err := a.d.Function(ctx, p.Name)
	if err != nil && !errors.Is(err, dispatch.ErrNotFound) {
		return mcpError(protocol.CodeUnavailable,
			fmt.Sprintf("%s is unavailable right now. Try again later or continue without it.", p.Name)), nil
	}
	if f == nil || !caller.Sees(f.Spec.Team) {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("unknown tool %q", p.Name)}
	}
	args := p.Arguments
	if len(args) == 0 || string(args) == "null" {
		args = json.RawMessage("{}")
	}
	switch asTask, _ := ctx.Value(taskRequestedKey{}).(bool); dialectFrom(ctx) {
	case tasksExperimental:
		if asTask {
			return a.mcpStartTask(mcpTraceContext(ctx, req), caller, f, dispatch.DirectCall{Function: p.Name, Arguments: args})
		}
	case tasksExtension:
		return a.mcpCallAsTask(mcpTraceContext(ctx, req), caller, f, dispatch.DirectCall{Function: p.Name, Arguments: args})
	}

	ctx = mcpTraceContext(ctx, req)
	ctx, span := a.tracer.Start(ctx, "tools/call "+p.Name, trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(attrMCPMethod.String("tools/call"), attrToolName.String(p.Name), attrTeam.String(f.Spec.Team),
			attrCaller.String(caller.Name)))
	defer span.End()
	if r, ok := ctx.Value(httpRequestKey{}).(context.Context); ok {
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		stop := context.AfterFunc(r, func() { cancel(errClientGone) })
		defer stop()
		defer cancel(nil)
	}

	c := dispatch.DirectCall{Function: p.Name, Arguments: args, Timeout: a.mcpTimeout(f), Handle: requestHandle(ctx, caller.Name)}
	if token := p.GetProgressToken(); token != nil {
		c.ProgressEvery = mcpProgressEvery
		c.Progress = func(elapsed time.Duration) {
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: token,
				Progress: elapsed.Seconds(), Message: fmt.Sprintf("%s running for %s", p.Name, elapsed.Round(time.Second))})
		}
	}
	res, err := a.d.Call(ctx, c)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, "call not completed")
		if ctx.Err() != nil {
			return nil, err // nobody is left to read an answer
		}
		if errors.Is(err, dispatch.ErrCancelled) {
			// The client said it no longer reads an answer; one that still
			// does reads why.
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("%s was cancelled by its client", p.Name)}
		}
		a.log.ErrorContext(ctx, "MCP call could not be taken in", "fn", p.Name, "err", err)
		return mcpError(protocol.CodeUnavailable,
			fmt.Sprintf("%s is unavailable right now (the call could not be queued). Try again later or continue without it.", p.Name)), nil
	}
	out, outcome := a.toolResult(ctx, p.Name, f.Spec, res)
	span.SetAttributes(attrOutcome.String(outcome))
	return out, nil
}

// toolResult is a call's result as the tool result its client reads, and
// its outcome for the span: its failure, or its output unless that breaks
// its function's declared output schema (spec nil: not known).
func (a *Handler) toolResult(ctx context.Context, name string, spec *protocol.FunctionSpec, res *protocol.Result) (*mcp.CallToolResult, string) {
	if res.Error != nil {
		return mcpError(res.Error.Code, res.Error.Message), string(res.Error.Code)
	}
	if spec == nil {
		return mcpResult(res), "ok"
	}
	if problem := a.d.CheckOutput(spec, []byte(res.Output)); problem != "" {
		// The client was promised structured output of this shape; what
		// the function returned is not it, which is the function's fault.
		a.log.WarnContext(ctx, "an MCP call's output breaks its function's output schema", "fn", name, "team", spec.Team, "problem", problem)
		return mcpError(protocol.CodeFunctionError, fmt.Sprintf("%s ran, but %s. The dispatcher logs it for the function's owners; "+
			"try again later or continue without it.", name, problem)), string(protocol.CodeFunctionError)
	}
	return mcpResult(res), "ok"
}

// mcpResult is a call's result as an MCP tool result: its output as text
// (and as structuredContent when it is a JSON object), or its failure.
func mcpResult(res *protocol.Result) *mcp.CallToolResult {
	if res.Error != nil {
		return mcpError(res.Error.Code, res.Error.Message)
	}
	out := &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: res.Output}}}
	var obj map[string]any
	if json.Unmarshal([]byte(res.Output), &obj) == nil && obj != nil {
		out.StructuredContent = json.RawMessage(res.Output)
	}
	return out
}

// errClientGone is the cause of a call's context cancelled because its
// client's HTTP request ended.
var errClientGone = errors.New("httpapi: the MCP client went away")

// mcpError is a failed call as an MCP tool result: isError, with the
// message the model reads (its type in _meta, for programs).
func mcpError(code protocol.ErrorCode, message string) *mcp.CallToolResult {
	return &mcp.CallToolResult{IsError: true, Content: []mcp.Content{&mcp.TextContent{Text: message}},
		Meta: mcp.Meta{metaErrorType: string(code)}}
}

// mcpTimeout is a tools/call's deadline: the function's own timeout, capped
// by MCPCallTimeout.
func (a *Handler) mcpTimeout(f *dispatch.FunctionStatus) time.Duration {
	timeout := a.opts.MCPCallTimeout
	if f.Served() {
		if t := time.Duration(f.Spec.Timeout); t > 0 && t < timeout {
			timeout = t
		}
	}
	return timeout
}

// mcpTraceContext continues the client's trace: the traceparent in the
// request's _meta (as the MCP semantic conventions carry it), else the one
// of the HTTP request.
func mcpTraceContext(ctx context.Context, req *mcp.CallToolRequest) context.Context {
	carrier := propagation.MapCarrier{}
	for _, k := range otelconv.Propagator.Fields() {
		if v, ok := req.Params.Meta[k].(string); ok {
			carrier[k] = v
		}
	}
	if carrier["traceparent"] != "" {
		return otelconv.Propagator.Extract(ctx, carrier)
	}
	if req.Extra != nil && req.Extra.Header != nil {
		return otelconv.Propagator.Extract(ctx, propagation.HeaderCarrier(req.Extra.Header))
	}
	return ctx
}
