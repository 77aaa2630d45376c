package protocol

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrInvalidName is wrapped by every error about a function or team name.
var ErrInvalidName = errors.New("protocol: invalid name")

var (
	// functionNameRE is the platforms' own rule for function names.
	functionNameRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)
	// teamNameRE is as strict: lower case so that team "Payments" and
	// "payments" cannot become two streams, and a leading letter or digit so
	// that names starting with "_" stay reserved for toolrelay itself.
	teamNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
)

// FunctionNamePattern and TeamNamePattern are the rules names must match.
const (
	FunctionNamePattern = `^[a-zA-Z0-9_-]{1,64}$`
	TeamNamePattern     = `^[a-z0-9][a-z0-9_-]{0,31}$`
)

// SystemTeam is the team token of results the dispatcher records itself for
// calls no team owns (an unknown function). No real team can be named so.
const SystemTeam = "_toolrelay"

// ValidateFunctionName reports whether name is a valid function name.
func ValidateFunctionName(name string) error {
	if !functionNameRE.MatchString(name) {
		return fmt.Errorf("%w: function name %q must match %s", ErrInvalidName, name, FunctionNamePattern)
	}
	return nil
}

// ValidateTeamName reports whether team is a valid team name.
func ValidateTeamName(team string) error {
	if !teamNameRE.MatchString(team) {
		return fmt.Errorf("%w: team name %q must match %s", ErrInvalidName, team, TeamNamePattern)
	}
	return nil
}

// validResultTeam accepts a team name or the system team.
func validResultTeam(team string) error {
	if team == SystemTeam {
		return nil
	}
	return ValidateTeamName(team)
}
