package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// DeadLetter is one dead-lettered call as GET /v1/deadletters and the
// console show it: why it failed for good and, once an operator replayed
// it, how the latest replay went.
type DeadLetter struct {
	Key      protocol.CallKey `json:"key"`
	Team     string           `json:"team"`
	Function string           `json:"function"`
	CallID   string           `json:"call_id"`
	Reason   string           `json:"reason"`
	Attempts int              `json:"attempts"`
	Executor string           `json:"executor,omitempty"`
	Error    string           `json:"error,omitempty"`
	At       time.Time        `json:"at"`
	// Replays is how many replays have an outcome recorded; LastReplay is
	// the latest of them.
	Replays    int     `json:"replays"`
	LastReplay *Replay `json:"last_replay,omitempty"`
}

// Replay is the recorded outcome of one replay of a dead letter.
type Replay struct {
	N        int       `json:"n"`
	Outcome  string    `json:"outcome"` // ok | error
	Error    string    `json:"error,omitempty"`
	Output   string    `json:"output,omitempty"`
	Executor string    `json:"executor,omitempty"`
	At       time.Time `json:"at"`
}

// replayOutputPreview bounds the output of a replay the list carries.
const replayOutputPreview = 512

// DeadLetterRecords bounds what the dead-letter list reads of each team:
// its newest records (a dead letter and each replay's outcome are one
// record each), so a page costs the same however many the teams keep.
const DeadLetterRecords = 1000

// teamsOf lists the teams whose dead letters caller asks for: team when
// given (one caller sees), else every team caller sees (for an admin,
// every team the dispatcher knows).
func (c *Console) teamsOf(caller dispatch.Caller, team string) ([]string, error) {
	switch {
	case team != "" && !caller.Sees(team):
		return nil, fmt.Errorf("%w: team %s is not one of your teams (%s)", dispatch.ErrOutOfScope, team, strings.Join(caller.Teams, ", "))
	case team != "":
		return []string{team}, nil
	case caller.Admin:
		return c.d.Teams(), nil
	}
	return caller.Teams, nil
}

// teamDeadLetters returns the dead letters kept in team's account, read
// through the dispatcher's way into it (dispatch.Dispatcher.TeamJetStream).
// Only records naming team count: in a deployment with an account per
// team, the team writes them.
func (c *Console) teamDeadLetters(team string) (*exec.DeadLetters, error) {
	js, err := c.d.TeamJetStream(team)
	if err != nil {
		return nil, err
	}
	return exec.NewTeamDeadLetters(js, team)
}

// deadLetters lists the dead letters caller sees, newest first, filtered
// by team and function when not empty: of each team in scope, what its
// newest DeadLetterRecords records say.
func (c *Console) deadLetters(ctx context.Context, caller dispatch.Caller, team, function string) ([]DeadLetter, error) {
	teams, err := c.teamsOf(caller, team)
	if err != nil {
		return nil, err
	}
	var records []*protocol.DeadLetter
	for _, t := range teams {
		dls, err := c.teamDeadLetters(t)
		if err != nil {
			return nil, err
		}
		rs, err := dls.ListNewest(ctx, t, DeadLetterRecords)
		if err != nil {
			return nil, err
		}
		records = append(records, rs...)
	}
	byKey := map[protocol.CallKey]*DeadLetter{}
	var out []*DeadLetter
	for _, r := range records { // oldest first: the original before its replays
		if function != "" && r.Call.Function != function {
			continue
		}
		dl := byKey[r.Call.Key]
		if r.Replay == 0 {
			if dl == nil {
				dl = &DeadLetter{}
				byKey[r.Call.Key] = dl
				out = append(out, dl)
			}
			replays, last := dl.Replays, dl.LastReplay
			*dl = DeadLetter{Key: r.Call.Key, Team: r.Call.Team, Function: r.Call.Function, CallID: r.Call.CallID, Reason: r.Reason,
				Attempts: r.Attempts, Executor: r.Executor, At: r.At, Replays: replays, LastReplay: last}
			if r.Result.Error != nil {
				dl.Error = r.Result.Error.Message
			}
			continue
		}
		if dl == nil {
			continue // a replay whose dead letter aged out
		}
		dl.Replays++
		if dl.LastReplay == nil || r.Replay > dl.LastReplay.N {
			rp := &Replay{N: r.Replay, Outcome: "ok", Executor: r.Executor, At: r.At}
			if r.Result.Error != nil {
				rp.Outcome, rp.Error = "error", r.Result.Error.Message
			} else {
				rp.Output = r.Result.Output[:min(len(r.Result.Output), replayOutputPreview)]
			}
			dl.LastReplay = rp
		}
	}
	list := make([]DeadLetter, 0, len(out))
	for _, dl := range out {
		list = append(list, *dl)
	}
	slices.SortFunc(list, func(a, b DeadLetter) int { return cmp.Or(b.At.Compare(a.At), cmp.Compare(a.Key, b.Key)) })
	return list, nil
}

// deadLettersData is the dead letters page.
type deadLettersData struct {
	Team, Function string
	Letters        []DeadLetter
	Records        int // DeadLetterRecords
}

func (c *Console) deadLettersPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	team, function := r.URL.Query().Get("team"), r.URL.Query().Get("function")
	list, err := c.deadLetters(ctx, httpapi.CallerOf(r), team, function)
	if err != nil {
		c.deadLetterError(w, r, err, func(status int, msg string) {
			c.render(w, r, status, "deadletters", page{Title: "Dead letters", Nav: "deadletters", Error: msg})
		})
		return
	}
	c.render(w, r, http.StatusOK, "deadletters", page{Title: "Dead letters", Nav: "deadletters",
		Data: deadLettersData{Team: team, Function: function, Letters: list, Records: DeadLetterRecords}})
}

// getDeadLetters serves GET /v1/deadletters?team=&function=.
func (c *Console) getDeadLetters(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	list, err := c.deadLetters(ctx, httpapi.CallerOf(r), r.URL.Query().Get("team"), r.URL.Query().Get("function"))
	if err != nil {
		c.deadLetterError(w, r, err, func(status int, msg string) { writeError(w, status, msg) })
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": list})
}

func (c *Console) deadLetterError(w http.ResponseWriter, r *http.Request, err error, answer func(int, string)) {
	if errors.Is(err, dispatch.ErrOutOfScope) {
		answer(http.StatusForbidden, strings.TrimPrefix(err.Error(), dispatch.ErrOutOfScope.Error()+": "))
		return
	}
	c.log.WarnContext(r.Context(), "reading dead letters failed", "err", err)
	answer(http.StatusServiceUnavailable, "could not read the dead letters: "+err.Error())
}

// ConsoleHeader must be on a request that changes something (a replay):
// a page of another site can make a browser send a form, not a custom
// header, so this stops cross-site requests riding on the login cookie
// (SameSite=Strict already keeps it from them) or on loopback trust.
const ConsoleHeader = "X-Toolrelay-Console"

// replayRequest is the body of POST /v1/deadletters/replay.
type replayRequest struct {
	Keys []protocol.CallKey `json:"keys"`
	// Timeout is the replayed calls' deadline from now, a Go duration.
	// Default: exec.DefaultReplayTimeout.
	Timeout string `json:"timeout,omitempty"`
}

// ReplayOutcome is what POST /v1/deadletters/replay says of one key: the
// replay's number (its outcome appears in GET /v1/deadletters once the
// executor records it), or why it was not replayed.
type ReplayOutcome struct {
	Key    protocol.CallKey `json:"key"`
	Replay int              `json:"replay,omitempty"`
	Error  string           `json:"error,omitempty"`
}

// maxReplayKeys bounds one replay request.
const maxReplayKeys = 500

func (c *Console) postReplay(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get(ConsoleHeader) == "" {
		writeError(w, http.StatusForbidden, "a replay request must carry the header "+ConsoleHeader+": 1")
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	var req replayRequest
	if err == nil {
		err = json.Unmarshal(body, &req)
	}
	if err != nil || len(req.Keys) == 0 || len(req.Keys) > maxReplayKeys {
		writeError(w, http.StatusBadRequest, fmt.Sprintf(`send {"keys":["<call key>", ...]} with 1 to %d keys`, maxReplayKeys))
		return
	}
	var timeout time.Duration
	if req.Timeout != "" {
		if timeout, err = time.ParseDuration(req.Timeout); err != nil || timeout <= 0 {
			writeError(w, http.StatusBadRequest, "timeout must be a positive Go duration such as 5m")
			return
		}
	}
	caller := httpapi.CallerOf(r)
	ctx, cancel := requestContext(r)
	defer cancel()
	teams, _ := c.teamsOf(caller, "")
	out := make([]ReplayOutcome, 0, len(req.Keys))
	for _, key := range req.Keys {
		o := ReplayOutcome{Key: key}
		dls, err := c.findDeadLetter(ctx, teams, key)
		switch {
		case errors.Is(err, exec.ErrNoDeadLetter) && !caller.Admin:
			o.Error = "no dead letter for this call among your teams' (" + strings.Join(caller.Teams, ", ") + ")"
		case errors.Is(err, exec.ErrNoDeadLetter):
			o.Error = "no dead letter for this call"
		case err != nil:
			o.Error = err.Error()
		default:
			if o.Replay, err = dls.Replay(ctx, key, timeout); err != nil {
				o.Error = err.Error()
			} else {
				c.log.InfoContext(ctx, "dead letter replayed", "call", key, "replay", o.Replay, "caller", caller)
			}
		}
		out = append(out, o)
	}
	writeJSON(w, http.StatusOK, map[string]any{"replays": out})
}

// findDeadLetter returns the dead letters of the one of teams that holds
// key's dead letter. The error is exec.ErrNoDeadLetter when none does.
func (c *Console) findDeadLetter(ctx context.Context, teams []string, key protocol.CallKey) (*exec.DeadLetters, error) {
	for _, t := range teams {
		dls, err := c.teamDeadLetters(t)
		if err != nil {
			return nil, err
		}
		if _, err := dls.Get(ctx, key); !errors.Is(err, exec.ErrNoDeadLetter) {
			return dls, err
		}
	}
	return nil, fmt.Errorf("%w %s", exec.ErrNoDeadLetter, key)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"error": map[string]string{"message": msg}})
}
