package protocol

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Executors declare what they serve by request to the dispatchers, which
// alone write the registry: a team's credentials can then reach only its
// own declarations, and which team owns a name is decided by the control
// plane (the first team to declare it), not by whoever writes a key first.
//
// An executor sends a DeclareRequest on DeclareSubject(team) when it
// starts, again every LeaseRenewal (each is a renewal of the lease), and
// with DeclareWithdraw when it stops. One dispatcher (replicas share a
// queue group) answers with a DeclareReply saying which declarations it
// stored and which it refused. No answer (no dispatcher running yet) is not
// a refusal: the executor keeps declaring.
const (
	DeclareSubjectPrefix = "toolrelay.declare"
	// MaxDeclarations bounds the declarations of one request.
	MaxDeclarations = 256
)

// DeclareSubject is where team's executors send their DeclareRequests.
func DeclareSubject(team string) string { return DeclareSubjectPrefix + "." + team }

// ParseDeclareSubject returns the team of a DeclareSubject.
func ParseDeclareSubject(subject string) (string, error) {
	team, ok := cutPrefixToken(subject, DeclareSubjectPrefix)
	if !ok {
		return "", fmt.Errorf("%w: declare subject %q: want %s.<team>", ErrMalformed, subject, DeclareSubjectPrefix)
	}
	if err := ValidateTeamName(team); err != nil {
		return "", fmt.Errorf("declare subject %q: %w", subject, err)
	}
	return team, nil
}

func cutPrefixToken(subject, prefix string) (string, bool) {
	if len(subject) <= len(prefix)+1 || subject[:len(prefix)] != prefix || subject[len(prefix)] != '.' {
		return "", false
	}
	return subject[len(prefix)+1:], true
}

// DeclareOp is what a DeclareRequest asks.
type DeclareOp string

const (
	// DeclareServe stores (or renews) the declarations.
	DeclareServe DeclareOp = "declare"
	// DeclareWithdraw removes them: the process stops serving.
	DeclareWithdraw DeclareOp = "withdraw"
)

// DeclareRequest is an executor process's declarations, all of its team.
type DeclareRequest struct {
	Version      int           `json:"v"`
	Op           DeclareOp     `json:"op"`
	Declarations []Declaration `json:"declarations"`
}

// Validate reports whether r is complete and of team alone.
func (r *DeclareRequest) Validate(team string) error {
	if r.Version < 1 || r.Version > Version {
		return fmt.Errorf("%w: declare request version %d not supported", ErrMalformed, r.Version)
	}
	if r.Op != DeclareServe && r.Op != DeclareWithdraw {
		return fmt.Errorf("%w: declare request op %q: want %q or %q", ErrMalformed, r.Op, DeclareServe, DeclareWithdraw)
	}
	if len(r.Declarations) == 0 || len(r.Declarations) > MaxDeclarations {
		return fmt.Errorf("%w: declare request has %d declarations: want 1 to %d", ErrMalformed, len(r.Declarations), MaxDeclarations)
	}
	for i := range r.Declarations {
		d := &r.Declarations[i]
		if err := d.Validate(); err != nil {
			return err
		}
		if d.Spec.Team != team {
			return fmt.Errorf("%w: declaration of %s is of team %q, sent as team %q", ErrMalformed, d.Spec.Name, d.Spec.Team, team)
		}
	}
	return nil
}

// EncodeDeclareRequest validates and encodes r.
func EncodeDeclareRequest(team string, r *DeclareRequest) ([]byte, error) {
	if err := r.Validate(team); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// DecodeDeclareRequest decodes a request received on team's DeclareSubject
// and validates it.
func DecodeDeclareRequest(team string, data []byte) (*DeclareRequest, error) {
	if len(data) > MaxEnvelopeSize {
		return nil, fmt.Errorf("%w: declare request of %d bytes exceeds %d", ErrMalformed, len(data), MaxEnvelopeSize)
	}
	var r DeclareRequest
	if err := decodeStrictJSON(data, &r); err != nil {
		return nil, fmt.Errorf("%w: declare request: %w", ErrMalformed, err)
	}
	if err := r.Validate(team); err != nil {
		return nil, err
	}
	return &r, nil
}

// DeclareReply is a dispatcher's answer to a DeclareRequest.
type DeclareReply struct {
	Version int `json:"v"`
	// Accepted names the functions whose declarations were stored (or,
	// for a withdrawal, removed).
	Accepted []string `json:"accepted,omitempty"`
	// Refused lists the declarations not stored, and why.
	Refused []Refusal `json:"refused,omitempty"`
	// Error, when set, says the request as a whole failed (malformed, or
	// the registry could not be written); the executor tries again.
	Error string `json:"error,omitempty"`
}

// Refusal is a declaration a dispatcher would not store.
type Refusal struct {
	Function string `json:"function"`
	// Owner is the team that owns the name, when that is the reason.
	Owner  string `json:"owner,omitempty"`
	Reason string `json:"reason"`
}

// DecodeDeclareReply decodes a dispatcher's answer.
func DecodeDeclareReply(data []byte) (*DeclareReply, error) {
	var r DeclareReply
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%w: declare reply: %w", ErrMalformed, err)
	}
	return &r, nil
}

// ControlAPIPrefix is where, in a deployment with an account per team
// (dispatcher nats-config), a team's account reaches the control account's
// JetStream API: only direct gets of its own results
// (ControlAPIPrefix.DIRECT.GET.<ResultStream(team)>.<result subject>).
// In a single-account deployment the control plane's API is the account's
// own, "$JS.API".
const ControlAPIPrefix = "$JS.toolrelay.API"

// DefaultAPIPrefix is JetStream's own API prefix.
const DefaultAPIPrefix = "$JS.API"

// TeamAPIPrefixTemplate is where, in a deployment with an account per team
// (dispatcher nats-config), the control account reaches each team's
// JetStream API, "{team}" standing for the team: only reads, of the team's
// call stream (its info and consumers: queue figures) and of its dead
// letters (stream info and direct gets), which the operator console shows.
// The dispatcher takes it as its TOOLRELAY_TEAM_API_PREFIX setting.
const TeamAPIPrefixTemplate = "$JS.team.{team}.API"

// TeamAPIPrefix is template (such as TeamAPIPrefixTemplate) with "{team}"
// replaced by team.
func TeamAPIPrefix(template, team string) string {
	return strings.ReplaceAll(template, "{team}", team)
}

// ResultGetSubject is the direct-get subject of the last (the only) result
// on key's result subject in team's result stream, under apiPrefix
// (DefaultAPIPrefix or ControlAPIPrefix).
func ResultGetSubject(apiPrefix, team string, key CallKey) string {
	return apiPrefix + ".DIRECT.GET." + ResultStream(team) + "." + ResultSubject(team, key)
}
