package httpapi

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// MCP tasks (the experimental tasks of protocol revision 2025-11-25): a
// tools/call with params.task is taken in as a started call
// ([dispatch.Dispatcher.StartCall]) and answered at once with the task,
// once its turn is recorded in JetStream; tasks/get, tasks/result and
// tasks/cancel read and cancel it from the turn record, on any replica,
// also after the replica that created it stopped, and tasks/list lists
// the caller's. The task's id is its turn's key; only its caller reads,
// lists or cancels it. The Tasks extension of 2026-07-28 shares all but
// the shapes (mcptasksext.go).
//
// The SDK knows nothing of tasks: the capability, each tool's
// execution.taskSupport and the CreateTaskResult are written here, and
// the methods are custom methods of the SDK's server.

const (
	// protocolTasks is the protocol revision whose clients are offered
	// the experimental tasks: the one that introduced them.
	protocolTasks = "2025-11-25"
	// MCPTaskTTL is every task's ttl: how long after its creation any
	// replica answers for it, as long as the dispatcher keeps a started
	// call's record and result. Clients' requested ttls are overridden, as
	// the specification allows.
	MCPTaskTTL = dispatch.StartedCallTTL
	// MCPTaskMaxRun bounds how long a task's call may run: its function's
	// timeout, or MCPCallTimeout where it declares none, up to this.
	MCPTaskMaxRun = time.Hour
	// mcpTaskPoll is the poll interval tasks suggest.
	mcpTaskPoll = 2 * time.Second
	// mcpTasksPage is the most tasks one tasks/list answers.
	mcpTasksPage = 100
	// metaRelatedTask ties a tasks/result answer to its task.
	metaRelatedTask = "io.modelcontextprotocol/related-task"
)

// taskRequestedKey holds, in a request's context, whether its tools/call
// asked for a task (params.task), which the SDK's parameters drop, or its
// subscriptions/listen for tasks' notifications ([withMessage] notes it).
type taskRequestedKey struct{}

// rawResult is a result written as JSON here, for what the SDK's types
// cannot say; _meta the SDK sets on it (its serverInfo) is added.
type rawResult struct {
	mcp.ResultBase
	raw json.RawMessage
}

func (r *rawResult) MarshalJSON() ([]byte, error) {
	if len(r.Meta) == 0 {
		return r.raw, nil
	}
	var obj map[string]any
	if err := json.Unmarshal(r.raw, &obj); err != nil {
		return nil, err
	}
	meta, _ := obj["_meta"].(map[string]any)
	if meta == nil {
		meta = map[string]any{}
	}
	for k, v := range r.Meta {
		if _, ok := meta[k]; !ok {
			meta[k] = v
		}
	}
	obj["_meta"] = meta
	return json.Marshal(obj)
}

// withFields returns v, marshalled to a JSON object, with the fields of
// add set (a value of nil removes one).
func withFields(v any, add func(obj map[string]any)) (*rawResult, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := json.Unmarshal(b, &obj); err != nil {
		return nil, err
	}
	add(obj)
	b, err = json.Marshal(obj)
	return &rawResult{raw: b}, err
}

// tasksCapability is what initialize advertises: task-augmented
// tools/call, tasks/list and tasks/cancel.
var tasksCapability = map[string]any{"list": map[string]any{}, "cancel": map[string]any{},
	"requests": map[string]any{"tools": map[string]any{"call": map[string]any{}}}}

// mcpInitialized adds the tasks capability to an initialize result of
// the revision offered tasks.
func mcpInitialized(res mcp.Result) mcp.Result {
	ir, ok := res.(*mcp.InitializeResult)
	if !ok || ir.ProtocolVersion != protocolTasks {
		return res
	}
	out, err := withFields(ir, func(obj map[string]any) {
		caps, _ := obj["capabilities"].(map[string]any)
		if caps == nil {
			caps = map[string]any{}
		}
		caps["tasks"] = tasksCapability
		obj["capabilities"] = caps
	})
	if err != nil {
		return res
	}
	return out
}

// mcpToolsWithTasks marks each listed tool as one a client may call as a
// task (execution.taskSupport: optional).
func mcpToolsWithTasks(res *mcp.ListToolsResult) (mcp.Result, error) {
	return withFields(res, func(obj map[string]any) {
		tools, _ := obj["tools"].([]any)
		for _, t := range tools {
			if tool, ok := t.(map[string]any); ok {
				tool["execution"] = map[string]any{"taskSupport": "optional"}
			}
		}
	})
}

// mcpTask is a task as MCP describes it.
type mcpTask struct {
	TaskID        string `json:"taskId"`
	Status        string `json:"status"`
	StatusMessage string `json:"statusMessage,omitempty"`
	CreatedAt     string `json:"createdAt"`
	LastUpdatedAt string `json:"lastUpdatedAt"`
	TTL           int64  `json:"ttl"`
	PollInterval  int64  `json:"pollInterval,omitempty"`
}

func taskOf(s *dispatch.StartedCall) mcpTask {
	t := mcpTask{TaskID: string(s.Key), CreatedAt: s.CreatedAt.UTC().Format(time.RFC3339Nano),
		LastUpdatedAt: s.UpdatedAt.UTC().Format(time.RFC3339Nano), TTL: MCPTaskTTL.Milliseconds()}
	switch {
	case s.State == dispatch.CallCancelled:
		t.Status, t.StatusMessage = "cancelled", "The task was cancelled by request."
	case s.State == dispatch.CallDone && s.Result.Error != nil:
		t.Status, t.StatusMessage = "failed", s.Result.Error.Message
	case s.State == dispatch.CallDone:
		t.Status = "completed"
	default:
		t.Status, t.PollInterval = "working", mcpTaskPoll.Milliseconds()
	}
	return t
}

// taskResult is a task as a result (of tasks/get and tasks/cancel).
func taskResult(s *dispatch.StartedCall) (mcp.Result, error) {
	b, err := json.Marshal(taskOf(s))
	return &rawResult{raw: b}, err
}

// startTask takes a tools/call in as a task: it returns once the task is
// durably created, or fails with the JSON-RPC error to answer.
func (a *Handler) startTask(ctx context.Context, caller dispatch.Caller, f *dispatch.FunctionStatus, c dispatch.DirectCall) (*dispatch.StartedCall, error) {
	c.Timeout = min(cmp.Or(max(time.Duration(f.Spec.Timeout), 0), a.opts.MCPCallTimeout), MCPTaskMaxRun)
	if n, err := a.d.RunningStartedCalls(ctx, caller.Name); err == nil && n >= a.opts.MaxMCPCallsPerCaller {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("the task of %s was not created: %s has %d tasks running "+
			"already, the most one caller may (TOOLRELAY_MAX_MCP_CALLS_PER_CALLER). Wait for one to end, then try again.", c.Function, caller.Name, n)}
	}
	s, err := a.d.StartCall(ctx, caller.Name, c)
	if err != nil {
		a.log.ErrorContext(ctx, "MCP task could not be created", "fn", c.Function, "err", err)
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError,
			Message: fmt.Sprintf("the task of %s could not be created (%v); try again later", c.Function, err)}
	}
	return s, nil
}

// mcpStartTask takes a tools/call asking for a task (2025-11-25) in as
// one and answers with it.
func (a *Handler) mcpStartTask(ctx context.Context, caller dispatch.Caller, f *dispatch.FunctionStatus, c dispatch.DirectCall) (mcp.Result, error) {
	s, err := a.startTask(ctx, caller, f, c)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(map[string]any{"task": taskOf(s), "_meta": map[string]any{
		"io.modelcontextprotocol/model-immediate-response": fmt.Sprintf("%s is running as task %s; its result comes when it ends.", c.Function, s.Key)}})
	return &rawResult{raw: b}, err
}

// taskParams are the params of tasks/get, tasks/result and tasks/cancel.
type taskParams struct {
	mcp.ParamsBase
	TaskID string `json:"taskId"`
}

// startedResult is the tool result of a started call that is done, as
// tools/call would have answered it: its output, unless that breaks its
// function's output schema.
func (a *Handler) startedResult(ctx context.Context, s *dispatch.StartedCall) *mcp.CallToolResult {
	var spec *protocol.FunctionSpec
	if f, err := a.d.Function(ctx, s.Function); err == nil && f.Served() {
		spec = f.Spec
	}
	res, _ := a.toolResult(ctx, s.Function, spec, s.Result)
	return res
}

// endedCall answers what tools/call would have for a started call that
// ended: its tool result, or the JSON-RPC error of a cancelled call.
func (a *Handler) endedCall(ctx context.Context, s *dispatch.StartedCall) (mcp.Result, error) {
	if s.State == dispatch.CallCancelled {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("%s was cancelled by its client", s.Function)}
	}
	return a.startedResult(ctx, s), nil
}

// listParams are the params of tasks/list.
type listParams struct {
	mcp.ParamsBase
	Cursor string `json:"cursor"`
}

// addTaskMethods registers tasks/get, tasks/result, tasks/list and
// tasks/cancel on srv, and the extension's tasks/update.
func (a *Handler) addTaskMethods(srv *mcp.Server) error {
	get := func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
		s, err := a.startedCall(ctx, p, false)
		if err != nil {
			return nil, err
		}
		if dialectFrom(ctx) == tasksExtension {
			return a.extTaskOf(ctx, s, "complete")
		}
		return taskResult(s)
	}
	result := func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
		s, err := a.startedCall(ctx, p, true)
		if err != nil {
			return nil, err
		}
		if s.State == dispatch.CallRunning {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("task %s has not ended; ask for its result again", s.Key)}
		}
		res, err := a.endedCall(ctx, s)
		if err != nil {
			return nil, err
		}
		tr := res.(*mcp.CallToolResult)
		if tr.Meta == nil {
			tr.Meta = mcp.Meta{}
		}
		tr.Meta[metaRelatedTask] = map[string]any{"taskId": string(s.Key)}
		return tr, nil
	}
	cancel := func(ctx context.Context, _ *mcp.ServerSession, p *taskParams) (mcp.Result, error) {
		caller, _ := callerFrom(ctx)
		s, err := a.startedCall(ctx, p, false)
		if err != nil {
			return nil, err
		}
		ext := dialectFrom(ctx) == tasksExtension
		ended := func(s *dispatch.StartedCall) (mcp.Result, error) {
			if ext {
				// Cancellation is a request the extension acknowledges
				// whatever the task's end.
				return &rawResult{raw: acknowledged}, nil
			}
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("task %s has ended (%s): it cannot be cancelled", s.Key, taskOf(s).Status)}
		}
		if s.State != dispatch.CallRunning {
			return ended(s)
		}
		if s, err = a.d.CancelStartedCall(ctx, caller.Name, s.Key); err != nil {
			return nil, taskError(p.TaskID, err)
		}
		switch {
		case s.State == dispatch.CallCancelled && ext:
			return &rawResult{raw: acknowledged}, nil
		case s.State == dispatch.CallCancelled:
			return taskResult(s)
		case s.State == dispatch.CallDone: // it ended first
			return ended(s)
		}
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("task %s could not be cancelled yet; try again", s.Key)}
	}
	for method, h := range map[string]func(context.Context, *mcp.ServerSession, *taskParams) (mcp.Result, error){
		"tasks/get": get, "tasks/result": result, "tasks/cancel": cancel} {
		if err := mcp.AddReceivingCustomMethod(srv, method, h); err != nil {
			return err
		}
	}
	if err := mcp.AddReceivingCustomMethod(srv, "tasks/list", a.listTasks); err != nil {
		return err
	}
	return a.addExtensionMethods(srv)
}

// listTasks answers tasks/list: the caller's tasks that have not
// expired, by id, mcpTasksPage at a time. Any caller, admin too, lists
// its own only: a task is bound to the caller that created it, as its
// reads and cancellation are.
func (a *Handler) listTasks(ctx context.Context, _ *mcp.ServerSession, p *listParams) (mcp.Result, error) {
	caller, _ := callerFrom(ctx)
	var after protocol.TurnKey
	if p != nil && p.Cursor != "" {
		key, err := base64.RawURLEncoding.DecodeString(p.Cursor)
		if err != nil || protocol.TurnKey(key).Validate() != nil {
			return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("invalid cursor %q: pass the nextCursor of a tasks/list result, or none for the first page", p.Cursor)}
		}
		after = protocol.TurnKey(key)
	}
	calls, more, err := a.d.StartedCalls(ctx, caller.Name, after, mcpTasksPage)
	if err != nil {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("the tasks cannot be listed right now (%v); try again shortly", err)}
	}
	res := struct {
		Tasks      []mcpTask `json:"tasks"`
		NextCursor string    `json:"nextCursor,omitempty"`
	}{Tasks: []mcpTask{}}
	for _, s := range calls {
		if time.Since(s.CreatedAt) <= MCPTaskTTL {
			res.Tasks = append(res.Tasks, taskOf(s))
		}
	}
	if more && len(calls) > 0 {
		res.NextCursor = base64.RawURLEncoding.EncodeToString([]byte(calls[len(calls)-1].Key))
	}
	b, err := json.Marshal(res)
	return &rawResult{raw: b}, err
}

// startedCall reads the caller's task p names; wait: once it has ended.
func (a *Handler) startedCall(ctx context.Context, p *taskParams, wait bool) (*dispatch.StartedCall, error) {
	caller, _ := callerFrom(ctx)
	if p == nil || p.TaskID == "" {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "taskId is required"}
	}
	s, err := a.d.StartedCall(ctx, caller.Name, protocol.TurnKey(p.TaskID), wait)
	if err != nil {
		return nil, taskError(p.TaskID, err)
	}
	if time.Since(s.CreatedAt) > MCPTaskTTL {
		return nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("Failed to retrieve task: task %s has expired", p.TaskID)}
	}
	return s, nil
}

// taskError is the JSON-RPC error of a failure to read or cancel a task.
func taskError(id string, err error) error {
	if errors.Is(err, dispatch.ErrNotFound) {
		return &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: fmt.Sprintf("Failed to retrieve task: no task %q of yours", id)}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return &jsonrpc.Error{Code: jsonrpc.CodeInternalError, Message: fmt.Sprintf("task %s cannot be read right now (%v); try again shortly", id, err)}
}
