package protocol

import (
	"fmt"
	"strings"
)

// Subject prefixes, stream names and KV buckets. Changing any of them is a
// breaking change of the wire contract.
const (
	CallSubjectPrefix   = "fncall"
	ResultSubjectPrefix = "fnresult"
	TimerSubjectPrefix  = "fntimer"

	// ResultStream holds every result; the first result of a call wins.
	ResultStream = "FNRESULTS"
	// TimerStream holds the deadline timers of open turns.
	TimerStream = "FNTIMERS"
	// callStreamPrefix + team is a team's work-queue stream of calls.
	callStreamPrefix = "FNCALLS_"

	// RegistryBucket maps function names to the claim of the team that
	// owns them: the FunctionSpec its executors last announced. A claim
	// outlives executors; what is served now is in DeclarationBucket.
	RegistryBucket = "toolrelay_functions"
	// DeclarationBucket holds one Declaration per function and executor
	// process, under DeclarationKey, each a lease that process renews.
	DeclarationBucket = "toolrelay_declarations"
	// TurnBucket maps turn keys to the dispatcher's turn records.
	TurnBucket = "toolrelay_turns"
	// WatchBucket maps watch IDs to what the dispatcher drives for them.
	WatchBucket = "toolrelay_watches"
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

// ResultSubject returns the subject of the result of a call owned by team.
func ResultSubject(team string, key CallKey) string {
	return ResultSubjectPrefix + "." + team + "." + string(key)
}

// TurnResultsFilter matches the results of every call of a turn.
func TurnResultsFilter(turn TurnKey) string {
	return ResultSubjectPrefix + ".*." + string(turn) + ".*"
}

// ParseResultSubject splits fnresult.<team>.<turn>.<call>.
func ParseResultSubject(subject string) (team string, key CallKey, err error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 4 || parts[0] != ResultSubjectPrefix {
		return "", "", fmt.Errorf("protocol: malformed result subject %q: want %s.<team>.<turn>.<call>", subject, ResultSubjectPrefix)
	}
	if err := validResultTeam(parts[1]); err != nil {
		return "", "", fmt.Errorf("protocol: result subject %q: %w", subject, err)
	}
	key, err = ParseCallKey(parts[2] + "." + parts[3])
	if err != nil {
		return "", "", fmt.Errorf("protocol: result subject %q: %w", subject, err)
	}
	return parts[1], key, nil
}

// TimerScheduleSubject is where a turn's deadline timer is scheduled, and
// TimerFireSubject where it fires.
func TimerScheduleSubject(turn TurnKey) string {
	return TimerSubjectPrefix + ".sched." + string(turn)
}

// TimerFireSubject is the subject a turn's deadline timer fires on.
func TimerFireSubject(turn TurnKey) string {
	return TimerSubjectPrefix + ".fire." + string(turn)
}

// TurnTimersFilter matches both subjects of a turn's timer: scheduled, and
// fired. Together the timer subjects index the open turns: a turn's are
// purged when it is submitted or failed.
func TurnTimersFilter(turn TurnKey) string {
	return TimerSubjectPrefix + ".*." + string(turn)
}

// ParseTimerSubject returns the turn of a scheduled or fired timer.
func ParseTimerSubject(subject string) (TurnKey, error) {
	parts := strings.Split(subject, ".")
	if len(parts) != 3 || parts[0] != TimerSubjectPrefix || (parts[1] != "sched" && parts[1] != "fire") {
		return "", fmt.Errorf("protocol: malformed timer subject %q", subject)
	}
	return ParseTurnKey(parts[2])
}

// ParseTimerFireSubject returns the turn of a fired deadline timer.
func ParseTimerFireSubject(subject string) (TurnKey, error) {
	rest, ok := strings.CutPrefix(subject, TimerSubjectPrefix+".fire.")
	if !ok {
		return "", fmt.Errorf("protocol: malformed timer subject %q", subject)
	}
	return ParseTurnKey(rest)
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

// Buckets and subjects of the dispatcher's intake channels.
const (
	// WebhookBucket remembers the webhook-ids already taken in, so a
	// replayed delivery does nothing new on any replica.
	WebhookBucket = "toolrelay_webhooks"
	// ResponseBucket maps the responses the dispatcher drives to their
	// watch, so a response.completed webhook finds its watch.
	ResponseBucket = "toolrelay_responses"
	// WatchSubject takes the body of POST /v1/watch as a NATS request and
	// answers with its JSON reply; WatchStatusSubject takes {"id":...}
	// and answers like GET /v1/watch/{id}.
	WatchSubject       = "toolrelay.watch"
	WatchStatusSubject = "toolrelay.watch.status"
)
