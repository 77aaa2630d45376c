package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
)

// The Tasks extension (io.modelcontextprotocol/tasks, SEP-2663), which
// protocol revision 2026-07-28 moved tasks into. A client declares it on
// each request, in _meta["io.modelcontextprotocol/clientCapabilities"]
// .extensions; server/discover advertises it. The server decides which
// calls become tasks: a tools/call of a declaring client is taken in as
// a started call, as an experimental task is, and answered with its
// tool result if it ends within mcpTaskAfter, else with a CreateTaskResult
// (resultType "task"). tasks/get answers the task with its result inlined
// once it has one (there is no tasks/result), tasks/update acknowledges
// input (no task of toolrelay ever asks for any), tasks/cancel
// acknowledges a cancellation. A client of 2026-07-28 that does not
// declare the extension gets -32021 for these methods, for a tools/call
// asking for a task (params.task) and for a subscriptions/listen asking
// for tasks' notifications (a declaring client is sent none: it polls).

const (
	// protocolTasksExtension is the first protocol revision whose tasks
	// are the extension's.
	protocolTasksExtension = "2026-07-28"
	// extTasks names the Tasks extension.
	extTasks = "io.modelcontextprotocol/tasks"
	// mcpTaskAfter is how long a tools/call of a client declaring the
	// extension may run before it is answered with a task instead of its
	// result: a quick call costs no polling, a long one no held request.
	mcpTaskAfter = time.Second
)

// taskDialect is which form of MCP tasks a request speaks.
type taskDialect int

const (
	tasksNone         taskDialect = iota // a revision without tasks (before 2025-11-25)
	tasksExperimental                    // 2025-11-25: params.task, tasks/get|result|list|cancel
	tasksExtension                       // 2026-07-28 or later, the request declaring the extension
	tasksUndeclared                      // 2026-07-28 or later, the request not declaring it
)

// taskDialectKey holds a request's taskDialect in its context.
type taskDialectKey struct{}

// dialectOf is the task dialect of a message, by the protocol version its
// _meta names (2026-07-28 and later), else its Mcp-Protocol-Version
// header.
func dialectOf(headerVersion string, msg *mcpMessage) taskDialect {
	v := headerVersion
	if msg.meta.ProtocolVersion != "" {
		v = msg.meta.ProtocolVersion
	}
	switch {
	case v >= protocolTasksExtension:
		if _, ok := msg.meta.ClientCapabilities.Extensions[extTasks]; ok {
			return tasksExtension
		}
		return tasksUndeclared
	case v == protocolTasks:
		return tasksExperimental
	}
	return tasksNone
}

// dialectFrom is the task dialect of the request of ctx.
func dialectFrom(ctx context.Context) taskDialect {
	d, _ := ctx.Value(taskDialectKey{}).(taskDialect)
	return d
}

// tasksGate refuses a method the request's task dialect does not have:
// -32021 for the extension's methods, a task asked for and tasks'
// notifications asked for, from a client of 2026-07-28 not declaring it;
// -32601 for a method of another dialect.
func tasksGate(ctx context.Context, method string) error {
	d := dialectFrom(ctx)
	asTask, _ := ctx.Value(taskRequestedKey{}).(bool)
	switch {
	case d == tasksUndeclared && (method == "tasks/get" || method == "tasks/update" || method == "tasks/cancel" ||
		(method == "tools/call" || method == methodListen) && asTask):
		data, _ := json.Marshal(mcp.MissingRequiredClientCapabilityData{
			RequiredCapabilities: &mcp.ClientCapabilities{Extensions: map[string]any{extTasks: map[string]any{}}}})
		return &jsonrpc.Error{Code: mcp.CodeMissingRequiredClientCapabilities, Data: data,
			Message: fmt.Sprintf("Missing required client capability: %s needs the %s extension declared in the request's "+
				"_meta[\"io.modelcontextprotocol/clientCapabilities\"].extensions", method, extTasks)}
	case (d == tasksExtension || d == tasksUndeclared) && (method == "tasks/result" || method == "tasks/list"):
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound,
			Message: fmt.Sprintf("%s is not a method of the %s extension: tasks/get answers a task's result", method, extTasks)}
	case d != tasksExtension && method == "tasks/update":
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "tasks/update is a method of the " + extTasks + " extension (protocol 2026-07-28)"}
	case d != tasksExperimental && method == "tasks/list":
		return &jsonrpc.Error{Code: jsonrpc.CodeMethodNotFound, Message: "tasks/list is a method of the experimental tasks of protocol 2025-11-25"}
	}
	return nil
}

// mcpDiscovered adds the Tasks extension to a server/discover result's
// capabilities.
func mcpDiscovered(res mcp.Result) mcp.Result {
	dr, ok := res.(*mcp.DiscoverResult)
	if !ok || dr.Capabilities == nil {
		return res
	}
	caps := *dr.Capabilities // the server's own stay as they are
	caps.Extensions = maps.Clone(caps.Extensions)
	if caps.Extensions == nil {
		caps.Extensions = map[string]any{}
	}
	caps.Extensions[extTasks] = map[string]any{}
	dr.Capabilities = &caps
	return dr
}

// extTask is a task as the extension describes it: a DetailedTask, its
// result inlined once it has one.
type extTask struct {
	ResultType     string          `json:"resultType"`
	TaskID         string          `json:"taskId"`
	Status         string          `json:"status"`
	StatusMessage  string          `json:"statusMessage,omitempty"`
	CreatedAt      string          `json:"createdAt"`
	LastUpdatedAt  string          `json:"lastUpdatedAt"`
	TTLMs          int64           `json:"ttlMs"`
	PollIntervalMs int64           `json:"pollIntervalMs"`
	Result         json.RawMessage `json:"result,omitempty"`
}

// extTaskOf describes s as the extension does, as the result of a method
// whose result type is resultType. A call that failed (a function's
// error, a timeout) is completed with its tool result, isError set, as
// the extension says: failed is for JSON-RPC errors, which a running
// call does not get.
func (a *Handler) extTaskOf(ctx context.Context, s *dispatch.StartedCall, resultType string) (*rawResult, error) {
	t := extTask{ResultType: resultType, TaskID: string(s.Key), CreatedAt: s.CreatedAt.UTC().Format(time.RFC3339Nano),
		LastUpdatedAt: s.UpdatedAt.UTC().Format(time.RFC3339Nano), TTLMs: MCPTaskTTL.Milliseconds(), PollIntervalMs: mcpTaskPoll.Milliseconds()}
	switch s.State {
	case dispatch.CallCancelled:
		t.Status, t.StatusMessage = "cancelled", "The task was cancelled by request."
	case dispatch.CallDone:
		res, err := completeResult(a.startedResult(ctx, s))
		if err != nil {
			return nil, err
		}
		t.Status, t.Result = "completed", res.raw
	default:
		t.Status = "working"
	}
	b, err := json.Marshal(t)
	return &rawResult{raw: b}, err
}

// completeResult is a tool result with its resultType said outright:
// "complete", which the SDK leaves out as the default, but the
// extension's clients read a result's type to tell it from a task.
func completeResult(res mcp.Result) (*rawResult, error) {
	return withFields(res, func(obj map[string]any) { obj["resultType"] = "complete" })
}

// acknowledged is the empty result of tasks/update and tasks/cancel.
var acknowledged = json.RawMessage(`{"resultType":"complete"}`)

// mcpCallAsTask runs a tools/call of a client declaring the extension as
// a started call: its tool result if it ends within mcpTaskAfter, else
// the task, durably created. A client gone before either is answered
// cancels the call: nobody knows its task.
func (a *Handler) mcpCallAsTask(ctx context.Context, caller dispatch.Caller, f *dispatch.FunctionStatus, c dispatch.DirectCall) (mcp.Result, error) {
	s, err := a.startTask(ctx, caller, f, c)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, mcpTaskAfter)
	ended, err := a.d.StartedCall(wctx, caller.Name, s.Key, true)
	cancel()
	if err == nil && ended.State != dispatch.CallRunning {
		res, err := a.endedCall(ctx, ended)
		if err != nil {
			return nil, err
		}
		return completeResult(res)
	}
	if r, ok := ctx.Value(httpRequestKey{}).(context.Context); ok && r.Err() != nil {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), goneCancelWait)
		defer cancel()
		if _, err := a.d.CancelStartedCall(cctx, caller.Name, s.Key); err != nil {
			a.log.WarnContext(ctx, "the task of a client gone before it was answered was not cancelled", "task", s.Key, "err", err)
		}
		return nil, r.Err()
	}
	return a.extTaskOf(ctx, s, "task")
}

// goneCancelWait bounds how long cancelling the call of a client that
// went away may take.
const goneCancelWait = 20 * time.Second

// updateParams are the params of tasks/update.
type updateParams struct {
	taskParams
	InputResponses json.RawMessage `json:"inputResponses"`
}

// addExtensionMethods registers tasks/update on srv; tasks/get and
// tasks/cancel serve both dialects.
func (a *Handler) addExtensionMethods(srv *mcp.Server) error {
	update := func(ctx context.Context, _ *mcp.ServerSession, p *updateParams) (mcp.Result, error) {
		var responses map[string]json.RawMessage
		if p == nil || json.Unmarshal(p.InputResponses, &responses) != nil || responses == nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "inputResponses is required: an object of responses keyed as the task's inputRequests"}
		}
		if _, err := a.startedCall(ctx, &p.taskParams, false); err != nil {
			return nil, err
		}
		// No task of toolrelay asks for input, so no key is outstanding:
		// every response is ignored, as the extension says.
		return &rawResult{raw: acknowledged}, nil
	}
	return mcp.AddReceivingCustomMethod(srv, "tasks/update", update)
}
