package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// FunctionSpec is what an executor announces about a function it serves:
// in the RegistryBucket under the function's name as its team's claim, and
// in each process's Declaration. The dispatcher validates arguments against
// the Parameters of live declarations and routes calls to Team's stream.
type FunctionSpec struct {
	Version     int             `json:"v"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
	// Team owns the function; only it may serve it.
	Team string `json:"team"`
	// Timeout bounds one run of the function; zero means the call's deadline.
	Timeout Duration `json:"timeout,omitzero"`
	// MaxConcurrency is the global cap on concurrent calls (all replicas).
	MaxConcurrency int `json:"max_concurrency,omitempty"`
	// SideEffects marks a function that must never run twice for a call.
	SideEffects bool `json:"side_effects,omitempty"`
	// FunctionVersion is the team's own version label of the implementation.
	FunctionVersion string `json:"function_version,omitempty"`
	// DeferLoading marks a function whose definition the agent loads on
	// demand (through a tool_search tool) instead of carrying it in every
	// request, for platforms that support it.
	DeferLoading bool `json:"defer_loading,omitempty"`
	// Format, when set, makes the function a custom tool: it takes the
	// model's raw text (constrained by a grammar, or not) instead of JSON
	// arguments, and Parameters is empty. See InputFormat.
	Format    *InputFormat `json:"format,omitempty"`
	UpdatedAt time.Time    `json:"updated_at"`
}

// Validate reports whether s is complete.
func (s *FunctionSpec) Validate() error {
	if s.Version < 1 || s.Version > Version {
		return fmt.Errorf("%w: function spec version %d not supported", ErrMalformed, s.Version)
	}
	if err := ValidateFunctionName(s.Name); err != nil {
		return err
	}
	if err := ValidateTeamName(s.Team); err != nil {
		return fmt.Errorf("function %s: %w", s.Name, err)
	}
	// Read without decoding: a number too large for a float64 is a bound
	// of the schema's (ValidateToolText, package schema), refused for this
	// declaration alone and by name, not a malformed request.
	p := bytes.TrimSpace(s.Parameters)
	if s.Format != nil {
		if err := s.Format.Validate(s.Name); err != nil {
			return err
		}
		if len(p) > 0 && string(p) != "null" {
			return fmt.Errorf("%w: function %s: a function with a format takes text, not parameters", ErrMalformed, s.Name)
		}
	} else if !json.Valid(p) || (p[0] != '{' && string(p) != "null") {
		return fmt.Errorf("%w: function %s: parameters must be a JSON Schema object", ErrMalformed, s.Name)
	}
	if s.Timeout < 0 || s.MaxConcurrency < 0 {
		return fmt.Errorf("%w: function %s: timeout and max_concurrency must not be negative", ErrMalformed, s.Name)
	}
	return nil
}

// EncodeFunctionSpec validates and encodes s.
func EncodeFunctionSpec(s *FunctionSpec) ([]byte, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(s)
}

// DecodeFunctionSpec decodes and validates a registry entry.
func DecodeFunctionSpec(data []byte) (*FunctionSpec, error) {
	var s FunctionSpec
	if err := decodeStrictJSON(data, &s); err != nil {
		return nil, fmt.Errorf("%w: function spec: %w", ErrMalformed, err)
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Leases of declarations. An executor process renews each of its
// declarations every LeaseRenewal; the DeclarationBucket's age limit is
// LeaseTTL, so the declaration of a process that stopped renewing (killed,
// partitioned) is removed by the server LeaseTTL after its last renewal,
// and a process that stops cleanly deletes its own.
const (
	LeaseTTL     = 15 * time.Second
	LeaseRenewal = LeaseTTL / 3
)

// Declaration is one executor process's announcement that it serves a
// function now, stored in the DeclarationBucket under DeclarationKey.
type Declaration struct {
	Version int `json:"v"`
	// Spec is the function as this process serves it.
	Spec FunctionSpec `json:"spec"`
	// Instance identifies the process uniquely (a random ID per run);
	// Executor is its human-readable name.
	Instance string `json:"instance"`
	Executor string `json:"executor,omitempty"`
	// StartedAt is when the process started serving; of two live
	// declarations with different schemas, the later is the newer.
	StartedAt time.Time `json:"started_at"`
}

// DeclarationKey is the key of instance's declaration of team's function
// in the DeclarationBucket: <team>.<function>.<instance>. The team comes
// first so that a deployment can scope a team to its own keys.
func DeclarationKey(team, function, instance string) string {
	return team + "." + function + "." + instance
}

// ParseDeclarationKey splits a DeclarationKey.
func ParseDeclarationKey(key string) (team, function, instance string, err error) {
	parts := strings.Split(key, ".")
	if len(parts) != 3 || ValidateTeamName(parts[0]) != nil || ValidateFunctionName(parts[1]) != nil || ValidateInstance(parts[2]) != nil {
		return "", "", "", fmt.Errorf("%w: declaration key %q: want <team>.<function>.<instance>", ErrMalformed, key)
	}
	return parts[0], parts[1], parts[2], nil
}

// ValidateInstance checks an executor instance ID: 1 to 64 letters,
// digits, '-' or '_', so that it is one subject token.
func ValidateInstance(id string) error {
	if !validName(id, 64, true) {
		return fmt.Errorf("%w: instance %q must match %s", ErrMalformed, id, FunctionNamePattern)
	}
	return nil
}

// Validate reports whether d is complete.
func (d *Declaration) Validate() error {
	if d.Version < 1 || d.Version > Version {
		return fmt.Errorf("%w: declaration version %d not supported", ErrMalformed, d.Version)
	}
	if err := d.Spec.Validate(); err != nil {
		return err
	}
	if err := ValidateInstance(d.Instance); err != nil {
		return err
	}
	if d.StartedAt.IsZero() {
		return fmt.Errorf("%w: declaration of %s has no started_at", ErrMalformed, d.Spec.Name)
	}
	return nil
}

// Key is d's key in the DeclarationBucket.
func (d *Declaration) Key() string { return DeclarationKey(d.Spec.Team, d.Spec.Name, d.Instance) }

// EncodeDeclaration validates and encodes d.
func EncodeDeclaration(d *Declaration) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// DecodeDeclaration decodes and validates a declaration.
func DecodeDeclaration(data []byte) (*Declaration, error) {
	var d Declaration
	if err := decodeStrictJSON(data, &d); err != nil {
		return nil, fmt.Errorf("%w: declaration: %w", ErrMalformed, err)
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return &d, nil
}

// Duration is a time.Duration that encodes as a Go duration string ("30s").
type Duration time.Duration

// MarshalJSON encodes d as a duration string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON decodes a duration string such as "1m30s".
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("duration must be a string such as \"30s\": %w", err)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}
