package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// A client cancels a tools/call with notifications/cancelled naming the
// call's JSON-RPC request id. On a stateless server that notification
// comes on a POST of its own, maybe to another replica than the call's, so
// the SDK cannot match it (it matches within one connection, and here each
// POST is one). toolrelay matches it by the call's handle, its caller and
// request id, through the dispatcher ([dispatch.Dispatcher.CancelCall]),
// on whichever replica runs the call. A caller so cancels only its own
// calls.

// methodCancelled is MCP's notification that a request is cancelled.
const methodCancelled = "notifications/cancelled"

// rpcIDKey holds, in a request's context, the JSON-RPC id of the message
// its POST carries (one per POST: batches are refused).
type rpcIDKey struct{}

// mcpMessage is what /mcp reads of a POST's JSON-RPC message before the
// SDK does, in one pass: its id, its method, the params of a
// notifications/cancelled (requestId, reason), of a tools/call asking
// for a task (task) or of a subscriptions/listen asking for task
// notifications (notifications.taskIds), and the protocol version and
// extensions its _meta declares (2026-07-28).
type mcpMessage struct {
	ID     json.RawMessage `json:"id"`
	Method string          `json:"method"`
	Params struct {
		RequestID any             `json:"requestId"`
		Reason    string          `json:"reason"`
		Task      json.RawMessage `json:"task"`
		Meta      json.RawMessage `json:"_meta"`
		// Notifications is read raw: a listen's params are the SDK's to
		// check.
		Notifications json.RawMessage `json:"notifications"`
	} `json:"params"`
	meta requestMeta
}

// requestMeta is what a request of 2026-07-28 says of its client in its
// _meta.
type requestMeta struct {
	ProtocolVersion    string `json:"io.modelcontextprotocol/protocolVersion"`
	ClientCapabilities struct {
		Extensions map[string]json.RawMessage `json:"extensions"`
	} `json:"io.modelcontextprotocol/clientCapabilities"`
}

// withMessage reads the JSON-RPC message of body, and notes in ctx its id,
// its task dialect (headerVersion is its Mcp-Protocol-Version) and
// whether it asks for a task (a tools/call) or tasks' notifications (a
// subscriptions/listen). A body it cannot read
// gives an empty message (the SDK answers it); a _meta it cannot read,
// none (the SDK refuses a request of 2026-07-28 without one).
func withMessage(ctx context.Context, body []byte, headerVersion string) (context.Context, *mcpMessage) {
	var msg mcpMessage
	if json.Unmarshal(body, &msg) != nil {
		return ctx, &mcpMessage{}
	}
	_ = json.Unmarshal(msg.Params.Meta, &msg.meta)
	if len(msg.ID) > 0 && string(msg.ID) != "null" {
		ctx = context.WithValue(ctx, rpcIDKey{}, msg.ID)
	}
	if msg.Method == "tools/call" && len(msg.Params.Task) > 0 && string(msg.Params.Task) != "null" {
		ctx = context.WithValue(ctx, taskRequestedKey{}, true)
	}
	var listen struct {
		TaskIDs json.RawMessage `json:"taskIds"`
	}
	if msg.Method == methodListen && json.Unmarshal(msg.Params.Notifications, &listen) == nil && len(listen.TaskIDs) > 0 && string(listen.TaskIDs) != "null" {
		ctx = context.WithValue(ctx, taskRequestedKey{}, true)
	}
	return context.WithValue(ctx, taskDialectKey{}, dialectOf(headerVersion, &msg)), &msg
}

// callHandle names the call of caller with JSON-RPC request id (as
// decoded JSON: a string or a number), or is empty if id is none. Ids that
// are equal as JSON values give one handle (7 and 7.0 do, 7 and "7" do
// not); the handle is a digest, so an id of any length gives a short one.
func callHandle(caller string, id any) string {
	if id == nil {
		return ""
	}
	b, err := json.Marshal(id)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(append([]byte(caller+"\x00"), b...))
	return "mcp:" + hex.EncodeToString(sum[:16])
}

// requestHandle is the handle of the request of ctx, by caller.
func requestHandle(ctx context.Context, caller string) string {
	raw, ok := ctx.Value(rpcIDKey{}).(json.RawMessage)
	if !ok {
		return ""
	}
	var id any
	if json.Unmarshal(raw, &id) != nil {
		return ""
	}
	return callHandle(caller, id)
}

// mcpCancelled cancels the caller's tools/call named by msg, if it is a
// notifications/cancelled, wherever the call runs. It is done here, before
// the SDK: a stateless session takes a notification in after answering it,
// and may be closed before it is handled. A notification is not answered,
// so a failure is only logged.
func (a *Handler) mcpCancelled(ctx context.Context, msg *mcpMessage) {
	if msg.Method != methodCancelled {
		return
	}
	caller, _ := callerFrom(ctx)
	handle := callHandle(caller.Name, msg.Params.RequestID)
	if handle == "" {
		return
	}
	if err := a.d.CancelCall(ctx, handle, msg.Params.Reason); err != nil {
		a.log.WarnContext(ctx, "an MCP cancellation could not be passed on", "caller", caller.Name, "err", err)
	}
}
