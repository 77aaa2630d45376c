package protocol

import (
	"encoding/json"
	"fmt"
	"time"
)

// FunctionSpec is what an executor announces about a function it serves, in
// the RegistryBucket under the function's name. The dispatcher validates
// arguments against Parameters and routes calls to Team's stream.
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
	FunctionVersion string    `json:"function_version,omitempty"`
	UpdatedAt       time.Time `json:"updated_at"`
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
	var schema map[string]any
	if err := json.Unmarshal(s.Parameters, &schema); err != nil {
		return fmt.Errorf("%w: function %s: parameters must be a JSON Schema object: %w", ErrMalformed, s.Name, err)
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
