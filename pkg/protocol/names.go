package protocol

import "fmt"

// FunctionNamePattern and TeamNamePattern are the rules names must match.
const (
	FunctionNamePattern = `^[a-zA-Z0-9_-]{1,64}$`
	TeamNamePattern     = `^[a-z0-9][a-z0-9_-]{0,31}$`
)

// SystemTeam is the team token of results the dispatcher records itself for
// calls no team owns (an unknown function). No real team can be named so.
const SystemTeam = "_toolrelay"

// ValidateFunctionName reports whether name is a valid function name: the
// platforms' own rule.
func ValidateFunctionName(name string) error {
	if !validName(name, 64, true) {
		return fmt.Errorf("%w: function name %q must match %s", ErrInvalidName, name, FunctionNamePattern)
	}
	return nil
}

// ValidateTeamName reports whether team is a valid team name: as strict,
// lower case so that "Payments" and "payments" cannot become two streams,
// and starting with a letter or digit so that names starting with "_" stay
// reserved for toolrelay itself.
func ValidateTeamName(team string) error {
	if !validName(team, 32, false) || team[0] == '_' || team[0] == '-' {
		return fmt.Errorf("%w: team name %q must match %s", ErrInvalidName, team, TeamNamePattern)
	}
	return nil
}

// validName checks the patterns above byte by byte (they are checked on
// every envelope, so no regular expression).
func validName(s string, maxLen int, upper bool) bool {
	if len(s) == 0 || len(s) > maxLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_', c == '-':
		case upper && 'A' <= c && c <= 'Z':
		default:
			return false
		}
	}
	return true
}

// validResultTeam accepts a team name or the system team.
func validResultTeam(team string) error {
	if team == SystemTeam {
		return nil
	}
	return ValidateTeamName(team)
}

// CanonicalFunctionName is the form of name that decides which names are
// one for ownership: ASCII letters folded to lower case, '-' read as '_',
// every run of '_' read as one, and '_' at either end dropped. Names with
// one canonical form (get_horoscope, Get_Horoscope, GET-HOROSCOPE,
// get__horoscope, _get_horoscope_) read alike to a person and to a model,
// so only one team may own them: the team owning any of them may declare
// the others, every other team is refused. A name of '_' and '-' alone is
// its own canonical form. The name must be valid (ValidateFunctionName).
func CanonicalFunctionName(name string) string {
	b := make([]byte, 0, len(name))
	gap := false
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c == '_' || c == '-':
			gap = len(b) > 0
			continue
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		if gap {
			b = append(b, '_')
			gap = false
		}
		b = append(b, c)
	}
	if len(b) == 0 {
		return name
	}
	return string(b)
}
