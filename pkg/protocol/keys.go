package protocol

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strconv"
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
	b := make([]byte, 0, 64)
	b = appendField(b, string(p))
	b = appendField(b, scope)
	for _, id := range ids {
		b = appendField(b, id)
	}
	sum := sha256.Sum256(b)
	var h [turnKeyLen]byte
	hex.Encode(h[:], sum[:turnKeyLen/2])
	return TurnKey(h[:]) // the only allocation: keys are held by every open turn
}

// appendField appends a length-prefixed field ("<len>:<s>;") so that
// ("ab","c") and ("a","bc") hash differently.
func appendField(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	b = append(b, s...)
	return append(b, ';')
}

// Call derives the key of the call with the given platform call ID.
func (t TurnKey) Call(callID string) CallKey {
	sum := sha256.Sum256(appendField(appendField(make([]byte, 0, 64), string(t)), callID))
	var h [callTokLen]byte
	hex.Encode(h[:], sum[:callTokLen/2])
	var k strings.Builder // one allocation, as for the turn key
	k.Grow(len(t) + 1 + callTokLen)
	k.WriteString(string(t))
	k.WriteByte('.')
	k.Write(h[:])
	return CallKey(k.String())
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
