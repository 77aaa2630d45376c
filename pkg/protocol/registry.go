package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/url"
	"regexp"
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
	Format *InputFormat `json:"format,omitempty"`
	// Title is a short name for people (an MCP tool's title, shown by
	// clients instead of Name): at most MaxTitleSize bytes of tool text.
	Title string `json:"title,omitempty"`
	// Icons are images a client may show beside the tool (an MCP tool's
	// icons): see Icon.
	Icons []Icon `json:"icons,omitempty"`
	// OutputSchema, when set, is the JSON Schema (an object at the top) of
	// the function's output, itself a JSON object: MCP clients get it as
	// the tool's outputSchema and the output as structuredContent, checked
	// against it first.
	OutputSchema json.RawMessage `json:"output_schema,omitempty"`
	// Approval, when set, holds the function's calls (all, or those its
	// condition picks) for a person's decision before any executor sees
	// them. See ApprovalPolicy.
	Approval  *ApprovalPolicy `json:"approval,omitempty"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// Icon is an image of a tool, as MCP describes one: where it is (an https
// URL, or a data: URL of at most MaxIconDataSize bytes), its media type,
// the sizes it comes in ("48x48", "any") and the background it is drawn
// for ("light", "dark"; empty: any).
type Icon struct {
	Src      string   `json:"src"`
	MIMEType string   `json:"mime_type,omitempty"`
	Sizes    []string `json:"sizes,omitempty"`
	Theme    string   `json:"theme,omitempty"`
}

// Bounds of a function's display metadata.
const (
	// MaxIcons bounds a function's icons.
	MaxIcons = 4
	// MaxIconDataSize bounds an icon given inline, as a data: URL; a
	// larger one belongs on a server, named by an https URL.
	MaxIconDataSize = 16 << 10
	// MaxIconURLSize bounds an icon's https URL.
	MaxIconURLSize = 2 << 10
)

var iconSize = regexp.MustCompile(`^(any|[0-9]{1,4}x[0-9]{1,4})$`)

// validate reports what is wrong with icon i of function, or nil.
func (ic *Icon) validate(function string, i int) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: function %s: icon %d: %s", ErrMalformed, function, i, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.HasPrefix(ic.Src, "data:image/"):
		if len(ic.Src) > MaxIconDataSize {
			return bad("a data: URL of %d bytes, over the limit of %d (MaxIconDataSize): serve it and give its https URL", len(ic.Src), MaxIconDataSize)
		}
	case strings.HasPrefix(ic.Src, "https://"):
		u, err := url.Parse(ic.Src)
		if err != nil || u.Host == "" || u.User != nil || len(ic.Src) > MaxIconURLSize {
			return bad("src %.80q is not an https URL of at most %d bytes (MaxIconURLSize)", ic.Src, MaxIconURLSize)
		}
	default:
		return bad("src must be an https URL or a data:image/ URL, not %.40q", ic.Src)
	}
	if ic.MIMEType != "" && (!strings.HasPrefix(ic.MIMEType, "image/") || len(ic.MIMEType) > 64 || strings.ContainsAny(ic.MIMEType, " ;,\"\n")) {
		return bad("mime_type %.80q is not an image type", ic.MIMEType)
	}
	if ic.Theme != "" && ic.Theme != "light" && ic.Theme != "dark" {
		return bad("theme %.40q is not light or dark", ic.Theme)
	}
	if len(ic.Sizes) > 8 {
		return bad("%d sizes; at most 8", len(ic.Sizes))
	}
	for _, sz := range ic.Sizes {
		if !iconSize.MatchString(sz) {
			return bad("size %.40q is not WxH (48x48) or any", sz)
		}
	}
	return nil
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
	if o := bytes.TrimSpace(s.OutputSchema); len(o) > 0 {
		var top struct {
			Type any `json:"type"`
		}
		if !json.Valid(o) || o[0] != '{' || json.Unmarshal(o, &top) != nil || (top.Type != nil && top.Type != "object") {
			return fmt.Errorf("%w: function %s: output_schema must be a JSON Schema of an object (\"type\": \"object\"): MCP's structured output is one", ErrMalformed, s.Name)
		}
	}
	if len(s.Icons) > MaxIcons {
		return fmt.Errorf("%w: function %s: %d icons; at most %d (MaxIcons)", ErrMalformed, s.Name, len(s.Icons), MaxIcons)
	}
	for i := range s.Icons {
		if err := s.Icons[i].validate(s.Name, i); err != nil {
			return err
		}
	}
	if s.Approval != nil {
		return s.Approval.Validate(s.Name)
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
//
// DeclareWait is how long an executor waits for the answer to one request
// before sending it again: longer than a dispatcher takes to store a
// request's declarations (it gives up a second sooner), so that the answer
// of a busy dispatcher is not abandoned and its work asked for twice.
const (
	LeaseTTL     = 15 * time.Second
	LeaseRenewal = LeaseTTL / 3
	DeclareWait  = 6 * time.Second
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
