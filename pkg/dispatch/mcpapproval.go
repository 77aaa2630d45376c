package dispatch

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/pkg/approval"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// MCP approval requests. A Responses conversation whose MCP tool needs
// the client's approval stops on an mcp_approval_request; the dispatcher
// answers it with an mcp_approval_response, deciding it as it decides its
// own held calls. Like a tool search, the request is a call of the turn
// the dispatcher answers itself: never published, its result is the
// decision (an output to approve, a failure to deny).
//
// A request under one of Options.MCPServerLabels names a function of this
// fleet (its /mcp lists each function as a tool of the same name): that
// function's approval policy decides. No policy, or a condition false for
// the arguments, approves at once; otherwise the request is held exactly
// as a held call (approvals.go), and once a person approves it a grant
// lets the one MCP call that follows, of the same function with the same
// arguments, run without being held again. A request of any other server
// is held for an admin.

// DefaultMCPServerLabels is the server_label agents give this fleet's own
// /mcp, unless Options.MCPServerLabels says otherwise.
var DefaultMCPServerLabels = []string{"toolrelay"}

// maxMCPNameLength bounds the server label and tool name of an MCP
// approval request, which the approval API and the audit trail show.
const maxMCPNameLength = 256

// otherServerPolicy holds every request of a server not the fleet's own
// for an admin.
var otherServerPolicy = func() *approval.Policy {
	p, err := approval.Compile("mcp", protocol.SystemTeam, &protocol.ApprovalPolicy{Required: true, Approvers: []string{protocol.ApproverAdmin}})
	if err != nil {
		panic(err)
	}
	return p
}()

// ownMCPServer reports whether label names this fleet's own /mcp.
func (d *Dispatcher) ownMCPServer(label string) bool {
	return slices.Contains(d.opts.MCPServerLabels, label)
}

// resolveMCPApproval resolves the MCP approval request c: its team, and
// its hold when it waits for a person. A request of the fleet's own
// server is resolved as a call of the function it names (a request that
// could not run, such as one of an unknown function or with arguments
// its schema refuses, is denied with the reason); another server's is
// held for an admin.
func (d *Dispatcher) resolveMCPApproval(ctx context.Context, c *TurnCall) (*hold, *protocol.CallError) {
	switch {
	case c.MCPServer == "" || len(c.MCPServer) > maxMCPNameLength || !utf8.ValidString(c.MCPServer):
		return nil, &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: "The MCP approval request names no valid server label."}
	case c.Name == "" || len(c.Name) > maxMCPNameLength || !utf8.ValidString(c.Name):
		return nil, &protocol.CallError{Code: protocol.CodeInvalidArguments, Message: "The MCP approval request names no valid tool."}
	}
	if d.ownMCPServer(c.MCPServer) {
		_, h, cerr := d.resolve(ctx, c, d.opts.ServeGrace)
		c.SideEffects = false // the request runs nothing; the MCP call that follows it does
		return h, cerr
	}
	c.Approval = true
	return &hold{policy: otherServerPolicy}, nil
}

// answerMCPApprovals approves each MCP approval request of t that needs
// no person (its function has no policy, or the policy's condition is
// false) and has no result in recorded (nil: none has), and appends the
// approval to the audit trail.
func (d *Dispatcher) answerMCPApprovals(ctx context.Context, t *Turn, recorded map[protocol.CallKey]bool) {
	for i := range t.Calls {
		c := &t.Calls[i]
		if c.MCPServer == "" || c.Rejected || c.Approval || recorded[c.Key] {
			continue
		}
		now := time.Now().UTC()
		a := &Approval{CallKey: c.Key, Turn: t.Key, CallID: c.ID, Platform: t.Ref.Platform, Team: c.Team, Function: c.Name,
			MCPServer: c.MCPServer, Arguments: c.Arguments, State: ApprovalApproved, RequestedAt: now, Deadline: t.Deadline,
			DecidedBy: "toolrelay", DecidedAt: now, Reason: "its function's approval policy does not require a person", TraceID: traceIDOf(ctx, t)}
		d.audit(ctx, auditRequested, a.Team, a.CallKey, "", auditEntryOf(a, auditRequested))
		d.audit(ctx, auditApproved, a.Team, a.CallKey, "", auditEntryOf(a, auditApproved))
		d.recordMCPDecision(ctx, t, c, a)
	}
}

// recordMCPDecision records a decision on the MCP approval request c as
// its result, first-wins: approved, an output saying by whom (and a grant
// for the MCP call the platform then makes, when a person approved a
// request of the fleet's own server); denied or not decided in time, a
// failure whose message is the reason the platform is given.
func (d *Dispatcher) recordMCPDecision(ctx context.Context, t *Turn, c *TurnCall, a *Approval) {
	ctx, stop := d.detached(ctx)
	defer stop()
	if a.State != ApprovalApproved {
		d.recordFailure(ctx, t, c, &protocol.CallError{Code: protocol.CodeDenied, Message: mcpReason(a)})
		return
	}
	if c.Approval && d.ownMCPServer(c.MCPServer) {
		if err := d.grant(ctx, c.Key, c.Name, c.Arguments, t.Deadline); err != nil {
			// Unrecorded, the approval is not given: the timer or a
			// resuming replica records it again.
			d.log.Error("granting an approved MCP call failed", "turn", t.Key, "call_key", c.Key, "err", err)
			return
		}
	}
	out, _ := json.Marshal(mcpReason(a))
	res := &protocol.Result{Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
		Output: string(out), Executor: "dispatcher/" + d.opts.Name, FinishedAt: time.Now().UTC()}
	if err := firstwins.Record(ctx, d.js.Conn(), res, nil, t.resultTTL(time.Now())); err != nil && ctx.Err() == nil {
		d.log.Error("recording an MCP approval failed", "turn", t.Key, "call_key", c.Key, "err", err)
	}
}

// mcpReason is the reason an mcp_approval_response gives for decision a.
func mcpReason(a *Approval) string {
	switch {
	case a.State == ApprovalExpired:
		return "not approved in time"
	case a.State == ApprovalApproved && a.DecidedBy == "toolrelay":
		return "approved by toolrelay: " + a.Reason
	case a.Reason != "":
		return fmt.Sprintf("%s by %s: %s", a.State, a.DecidedBy, a.Reason)
	}
	return fmt.Sprintf("%s by %s", a.State, a.DecidedBy)
}

// Grants. A person's approval of a request of the fleet's own server lets
// the MCP call that follows it run: the platform's tools/call carries
// nothing that names the request, so the grant is found by the function
// and the arguments, in the approval bucket under grant.<digest>, and
// taken (by compare-and-set) by the first such direct call until the
// turn's deadline. Two requests approved with the same function and
// arguments grant two calls; one request grants one call however often
// its approval is recorded (the timer and a resuming replica record it
// again when recording failed), as the grant names the requests it was
// given for, and those whose call it let run.

const grantPrefix = "grant."

// grantRecord is a grant's value in the approval bucket: the requests
// (their call keys) whose approval may still let a call run, and those
// whose approval let one run already.
type grantRecord struct {
	Function string             `json:"function"`
	Open     []protocol.CallKey `json:"open,omitempty"`
	Taken    []protocol.CallKey `json:"taken,omitempty"`
	Until    time.Time          `json:"until"`
}

// grantKey is the bucket key of the grant of function with args.
func grantKey(function string, args json.RawMessage) string {
	h := sha256.New()
	h.Write([]byte(function))
	h.Write([]byte{0})
	h.Write(canonicalJSON(args))
	return grantPrefix + hex.EncodeToString(h.Sum(nil))[:40]
}

// canonicalJSON re-encodes a JSON value with its objects' keys sorted and
// its numbers as written, so that the arguments of the request and of
// the MCP call compare equal however each was encoded.
func canonicalJSON(b json.RawMessage) []byte {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return b
	}
	out, err := json.Marshal(v)
	if err != nil {
		return b
	}
	return out
}

// grant lets one call of function with args run, good until, for the
// approved request request; a request granted already grants nothing more.
func (d *Dispatcher) grant(ctx context.Context, request protocol.CallKey, function string, args json.RawMessage, until time.Time) error {
	key := grantKey(function, args)
	for range 8 {
		g := grantRecord{Function: function, Open: []protocol.CallKey{request}, Until: until.UTC()}
		e, err := d.approvals.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			b, _ := json.Marshal(g)
			_, err = d.approvals.Create(ctx, key, b)
		case err != nil:
			return err
		default:
			var old grantRecord
			if json.Unmarshal(e.Value(), &old) == nil {
				if slices.Contains(old.Open, request) || slices.Contains(old.Taken, request) {
					return nil
				}
				if old.Until.After(time.Now()) {
					g.Open = append(old.Open, request)
					g.Until = maxTime(g.Until, old.Until)
				}
				g.Taken = old.Taken
			}
			b, _ := json.Marshal(g)
			_, err = d.approvals.Update(ctx, key, b, e.Revision())
		}
		if err == nil || !conflict(err) {
			return err
		}
	}
	return fmt.Errorf("dispatch: grant %s: too many concurrent writers", key)
}

// takeGrant takes one grant for a call of function with args, if there is
// one still good.
func (d *Dispatcher) takeGrant(ctx context.Context, function string, args json.RawMessage) bool {
	key := grantKey(function, args)
	for range 8 {
		e, err := d.approvals.Get(ctx, key)
		if err != nil {
			return false
		}
		var g grantRecord
		if json.Unmarshal(e.Value(), &g) != nil || len(g.Open) == 0 || !g.Until.After(time.Now()) {
			return false
		}
		// Kept, with the request it was taken for, until the bucket's age
		// limit removes it: the request's approval recorded again then
		// grants nothing.
		g.Taken, g.Open = append(g.Taken, g.Open[0]), g.Open[1:]
		b, _ := json.Marshal(g)
		_, err = d.approvals.Update(ctx, key, b, e.Revision())
		if err == nil {
			d.log.InfoContext(ctx, "an MCP call runs on an approval given to its request", "fn", function)
			return true
		}
		if !conflict(err) {
			d.log.Warn("taking an MCP call's grant failed; the call waits for approval", "fn", function, "err", err)
			return false
		}
	}
	return false
}

func conflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) || firstwins.Lost(err)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
