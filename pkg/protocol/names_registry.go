package protocol

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
)

// NameClaim is an entry of the NameBucket: which team owns every function
// name of one canonical form (CanonicalFunctionName), stored under that
// form. A dispatcher creates it, by compare-and-set, before it creates the
// claim of a name in the RegistryBucket, so of two teams racing for two
// confusable names on two dispatchers one wins.
type NameClaim struct {
	Version int    `json:"v"`
	Team    string `json:"team"`
	// Reserved marks a name an operator reserved for Team (dispatcher
	// functions reserve): it does not lapse while no executor serves it.
	Reserved bool `json:"reserved,omitempty"`
	// By says who wrote it: a dispatcher replica, or "operator".
	By        string    `json:"by,omitempty"`
	UpdatedAt time.Time `json:"updated_at"`
}

// EncodeNameClaim validates and encodes c.
func EncodeNameClaim(c *NameClaim) ([]byte, error) {
	if err := ValidateTeamName(c.Team); err != nil {
		return nil, err
	}
	return json.Marshal(c)
}

// DecodeNameClaim decodes and validates an entry of the NameBucket.
func DecodeNameClaim(data []byte) (*NameClaim, error) {
	var c NameClaim
	if err := decodeStrictJSON(data, &c); err != nil {
		return nil, fmt.Errorf("%w: name claim: %w", ErrMalformed, err)
	}
	if c.Version < 1 || c.Version > Version {
		return nil, fmt.Errorf("%w: name claim version %d not supported", ErrMalformed, c.Version)
	}
	if err := ValidateTeamName(c.Team); err != nil {
		return nil, err
	}
	return &c, nil
}

// NameBucketSpec holds the NameClaims, one per canonical function name.
// Only dispatchers and the operator's dispatcher functions command write
// it, by compare-and-set; a lapsed claim is purged, so its bytes go.
func NameBucketSpec() BucketSpec {
	return BucketSpec{Name: NameBucket, Description: "toolrelay owners of function names by canonical form", History: 1}
}

// Bounds on one declaration's bytes. The tool text bounds (tooltext.go)
// leave room for a declaration far smaller than a request; these bound
// the rest, so that what one declaration stores in the registry is small.
const (
	// MaxLabelSize bounds a declaration's executor name and its
	// function's version label, in bytes.
	MaxLabelSize = 256
	// MaxDeclarationSize bounds one declaration as encoded, in bytes:
	// room for a description and a parameters' schema at their own
	// bounds, escaped.
	MaxDeclarationSize = 128 << 10
)

// ErrTooLarge is wrapped by every error about a declaration over a bound
// of its bytes: MaxLabelSize, MaxDeclarationSize, or a dispatcher's bound
// on a team's registry bytes.
var ErrTooLarge = errors.New("protocol: declaration too large")

// ValidateSize checks d against MaxLabelSize and, encoded as size bytes,
// MaxDeclarationSize.
func (d *Declaration) ValidateSize(size int) error {
	for _, l := range []struct{ what, s string }{{"executor", d.Executor}, {"function_version", d.Spec.FunctionVersion}} {
		if len(l.s) > MaxLabelSize {
			return fmt.Errorf("%w: declaration of %s: %s is %d bytes, over the limit of %d (MaxLabelSize)", ErrTooLarge, d.Spec.Name, l.what, len(l.s), MaxLabelSize)
		}
		if i := strings.IndexFunc(l.s, unicode.IsControl); i >= 0 {
			return fmt.Errorf("%w: declaration of %s: %s has a control character at byte %d", ErrMalformed, d.Spec.Name, l.what, i)
		}
	}
	if size > MaxDeclarationSize {
		return fmt.Errorf("%w: declaration of %s is %d bytes, over the limit of %d (MaxDeclarationSize)", ErrTooLarge, d.Spec.Name, size, MaxDeclarationSize)
	}
	return nil
}
