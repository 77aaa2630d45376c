package protocol

import (
	"fmt"
	"strings"
)

// Subject prefixes, stream names and KV buckets of the contract. Changing
// any of them is a breaking change.
const (
	CallSubjectPrefix   = "fncall"
	ResultSubjectPrefix = "fnresult"

	// resultStreamPrefix + team is the stream of a team's results; the
	// first result of a call wins (see ResultStreamSpec).
	resultStreamPrefix = "FNRESULTS_"
	// callStreamPrefix + team is a team's work-queue stream of calls.
	callStreamPrefix = "FNCALLS_"

	// RegistryBucket maps function names to the claim of the team that
	// owns them: the FunctionSpec its executors last declared. A claim
	// outlives executors; what is served now is in DeclarationBucket.
	// Dispatchers alone write both.
	RegistryBucket = "toolrelay_functions"
	// DeclarationBucket holds one Declaration per function and executor
	// process, under DeclarationKey, each a lease that process renews by
	// DeclareRequest.
	DeclarationBucket = "toolrelay_declarations"
	// NameBucket maps each canonical function name
	// (CanonicalFunctionName) to the team owning the names of that form:
	// a NameClaim. Dispatchers alone write it.
	NameBucket = "toolrelay_names"
)

// CallStream returns the name of team's work-queue stream of calls.
func CallStream(team string) string { return callStreamPrefix + team }

// CallSubject returns the subject calls of a function are published to. The
// caller must have validated both names.
func CallSubject(team, function string) string {
	return CallSubjectPrefix + "." + team + "." + function
}

// CallStreamSubjects returns the subjects of team's call stream.
func CallStreamSubjects(team string) []string {
	return []string{CallSubjectPrefix + "." + team + ".>"}
}

// ParseCallSubject splits fncall.<team>.<function> and validates both names.
func ParseCallSubject(subject string) (team, function string, err error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 3 || parts[0] != CallSubjectPrefix {
		return "", "", fmt.Errorf("protocol: malformed call subject %q: want %s.<team>.<function>", subject, CallSubjectPrefix)
	}
	if err := ValidateTeamName(parts[1]); err != nil {
		return "", "", fmt.Errorf("protocol: call subject %q: %w", subject, err)
	}
	if err := ValidateFunctionName(parts[2]); err != nil {
		return "", "", fmt.Errorf("protocol: call subject %q: %w", subject, err)
	}
	return parts[1], parts[2], nil
}

// ResultStream returns the name of the stream of team's results. Each
// team has its own, so that its size limit, its duplicate window and its
// direct gets concern that team alone.
func ResultStream(team string) string { return resultStreamPrefix + team }

// ResultStreamSubjects returns the subjects of team's result stream.
func ResultStreamSubjects(team string) []string {
	return []string{ResultSubjectPrefix + "." + team + ".>"}
}

// ResultStreamTeam returns the team of a result stream's name, and whether
// name is one.
func ResultStreamTeam(name string) (string, bool) {
	team, ok := strings.CutPrefix(name, resultStreamPrefix)
	if !ok || validResultTeam(team) != nil {
		return "", false
	}
	return team, true
}

// ResultSubject returns the subject of the result of a call owned by team.
func ResultSubject(team string, key CallKey) string {
	return ResultSubjectPrefix + "." + team + "." + string(key)
}

// TurnResultsFilter matches the results of every call of a turn.
func TurnResultsFilter(turn TurnKey) string {
	return ResultSubjectPrefix + ".*." + string(turn) + ".*"
}

// ParseResultSubject splits fnresult.<team>.<turn>.<call>.
// The team and the key are slices of subject: the dispatcher parses every
// result's subject, and splitting it cost two allocations each time.
func ParseResultSubject(subject string) (team string, key CallKey, err error) {
	rest, prefixed := strings.CutPrefix(subject, ResultSubjectPrefix+".")
	team, call, split := strings.Cut(rest, ".")
	if !prefixed || !split || strings.Count(call, ".") != 1 {
		return "", "", fmt.Errorf("protocol: malformed result subject %q: want %s.<team>.<turn>.<call>", subject, ResultSubjectPrefix)
	}
	if err := validResultTeam(team); err != nil {
		return "", "", fmt.Errorf("protocol: result subject %q: %w", subject, err)
	}
	key, err = ParseCallKey(call)
	if err != nil {
		return "", "", fmt.Errorf("protocol: result subject %q: %w", subject, err)
	}
	return team, key, nil
}

// Cancellations: when a platform cancels or expires a run, the dispatcher
// tells the owning teams' executors to stop the turn's calls.
const (
	CancelSubjectPrefix = "fncancel"
	CancelStream        = "FNCANCELS"
)

// CancelSubject is where the cancellation of a turn is sent to team.
func CancelSubject(team string, turn TurnKey) string {
	return CancelSubjectPrefix + "." + team + "." + string(turn)
}

// TeamCancelFilter matches every cancellation sent to team.
func TeamCancelFilter(team string) string {
	return CancelSubjectPrefix + "." + team + ".*"
}

// ParseCancelSubject returns the team and turn of a cancellation.
func ParseCancelSubject(subject string) (team string, turn TurnKey, err error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 3 || parts[0] != CancelSubjectPrefix {
		return "", "", fmt.Errorf("protocol: malformed cancel subject %q", subject)
	}
	if err := ValidateTeamName(parts[1]); err != nil {
		return "", "", err
	}
	turn, err = ParseTurnKey(parts[2])
	return parts[1], turn, err
}

// The dispatcher answers watch requests over NATS as well as HTTP.
const (
	// WatchSubject takes the body of POST /v1/watch as a NATS request and
	// answers with its JSON reply; WatchStatusSubject takes {"id":...}
	// and answers like GET /v1/watch/{id}.
	WatchSubject       = "toolrelay.watch"
	WatchStatusSubject = "toolrelay.watch.status"
)
