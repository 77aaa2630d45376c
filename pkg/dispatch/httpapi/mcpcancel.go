package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/mcp"
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

// withRPCID notes in ctx the id of the JSON-RPC message body, if it has one.
func withRPCID(ctx context.Context, body []byte) context.Context {
	var msg struct {
		ID json.RawMessage `json:"id"`
	}
	if json.Unmarshal(body, &msg) != nil || len(msg.ID) == 0 || string(msg.ID) == "null" {
		return ctx
	}
	return context.WithValue(ctx, rpcIDKey{}, msg.ID)
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

// mcpCancelled cancels the caller's tools/call named by body, if it is a
// notifications/cancelled, wherever the call runs. It is done here, before
// the SDK: a stateless session takes a notification in after answering it,
// and may be closed before it is handled. A notification is not answered,
// so a failure is only logged.
func (a *Handler) mcpCancelled(ctx context.Context, body []byte) {
	var msg struct {
		Method string               `json:"method"`
		Params *mcp.CancelledParams `json:"params"`
	}
	if json.Unmarshal(body, &msg) != nil || msg.Method != methodCancelled || msg.Params == nil {
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
