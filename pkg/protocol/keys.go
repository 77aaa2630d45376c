package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
)

// Key lengths in hex characters: 128 bits for turns, 64 bits for a call
// within its turn.
const (
	turnKeyLen = 32
	callTokLen = 16
)

// TurnKey identifies one turn: one required action of one platform scope.
// It is 32 lower-case hex characters, safe as a NATS subject token and a KV key.
type TurnKey string

// CallKey identifies one call: "<turn key>.<16 hex>". It is the JetStream
// message ID of the call and of its result.
type CallKey string

// NewTurnKey derives the key of the turn in which a platform scope (session
// and turn, thread and run, or response) asks for the given calls. The order
// of callIDs does not matter, so every channel that learns of the same
// required action derives the same key.
func NewTurnKey(p Platform, scope string, callIDs []string) TurnKey {
	ids := slices.Clone(callIDs)
	slices.Sort(ids)
	h := sha256.New()
	writeField(h, string(p))
	writeField(h, scope)
	for _, id := range ids {
		writeField(h, id)
	}
	return TurnKey(hex.EncodeToString(h.Sum(nil))[:turnKeyLen])
}

// writeField writes a length-prefixed field so that ("ab","c") and ("a","bc")
// hash differently.
func writeField(h interface{ Write([]byte) (int, error) }, s string) {
	_, _ = fmt.Fprintf(h, "%d:%s;", len(s), s)
}

// Call derives the key of the call with the given platform call ID.
func (t TurnKey) Call(callID string) CallKey {
	h := sha256.New()
	writeField(h, string(t))
	writeField(h, callID)
	return CallKey(string(t) + "." + hex.EncodeToString(h.Sum(nil))[:callTokLen])
}

// Validate reports whether t is well formed.
func (t TurnKey) Validate() error {
	if len(t) != turnKeyLen || !isLowerHex(string(t)) {
		return fmt.Errorf("protocol: malformed turn key %q: want %d lower-case hex characters", string(t), turnKeyLen)
	}
	return nil
}

// ParseTurnKey validates s as a turn key.
func ParseTurnKey(s string) (TurnKey, error) {
	t := TurnKey(s)
	return t, t.Validate()
}

// ParseCallKey validates s as a call key.
func ParseCallKey(s string) (CallKey, error) {
	c := CallKey(s)
	return c, c.Validate()
}

// Validate reports whether c is well formed.
func (c CallKey) Validate() error {
	turn, tok, ok := strings.Cut(string(c), ".")
	if !ok || TurnKey(turn).Validate() != nil || len(tok) != callTokLen || !isLowerHex(tok) {
		return fmt.Errorf("protocol: malformed call key %q: want <%d hex>.<%d hex>", string(c), turnKeyLen, callTokLen)
	}
	return nil
}

// Turn returns the key of the turn the call belongs to. It is empty when c is
// malformed.
func (c CallKey) Turn() TurnKey {
	turn, _, ok := strings.Cut(string(c), ".")
	if !ok {
		return ""
	}
	return TurnKey(turn)
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !('0' <= b && b <= '9' || 'a' <= b && b <= 'f') {
			return false
		}
	}
	return true
}

// Message IDs (Nats-Msg-Id) make re-publishing safe: within a stream's
// Duplicates window the server stores a message ID once.

// CallMsgID is the message ID of a call: its key.
func CallMsgID(key CallKey) string { return string(key) }

// ResultMsgID is the message ID of a call's result: the call key too (the
// results stream is another stream, so the IDs do not collide).
func ResultMsgID(key CallKey) string { return string(key) }

// CancelMsgID is the message ID of the cancellation of turn sent to team.
func CancelMsgID(turn TurnKey, team string) string { return "cancel." + string(turn) + "." + team }
