package console

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Pages list at most this many turns of each kind; the open ones are the
// nearest their deadline, and the API (limit=0) has the rest.
const (
	pageOpenTurns   = 200
	pageRecentTurns = 50
)

// turnsData is the turns page.
type turnsData struct {
	Query dispatch.TurnQuery
	// Stream is the query of GET /v1/turns/stream with the page's filters.
	Stream  string
	List    *dispatch.TurnList
	Limit   int // most open turns the page shows
	Hidden  int // open turns beyond it
	Teams   []string
	Funcs   []string
	Outcome []string
	// Held are the calls awaiting approval the caller sees: first on the
	// page, for they wait on a person.
	Held []httpapi.ApprovalView
}

func (c *Console) turnsPage(w http.ResponseWriter, r *http.Request) {
	caller := httpapi.CallerOf(r)
	q, fe := httpapi.ParseTurnQuery(caller, r)
	if fe != nil {
		c.inspectError(w, r, "turns", fe)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	openQ, recentQ := q, q
	openQ.OpenOnly, openQ.Limit = true, pageOpenTurns
	recentQ.Limit = pageRecentTurns
	list, err := c.d.InspectTurns(ctx, caller, openQ)
	if err == nil && !q.OpenOnly && q.Outcome != "open" {
		var recent *dispatch.TurnList
		if recent, err = c.d.InspectTurns(ctx, caller, recentQ); err == nil {
			list.Recent, list.RecentKept = recent.Recent, recent.RecentKept
		}
	}
	if err != nil {
		c.inspectError(w, r, "turns", err)
		return
	}
	stream := r.URL.Query()
	stream.Del("open")
	stream.Del("outcome")
	stream.Set("limit", strconv.Itoa(pageOpenTurns))
	data := turnsData{Query: q, Stream: stream.Encode(), List: list, Limit: pageOpenTurns, Hidden: list.OpenTotal - len(list.Open),
		Outcome: []string{"open", "submitted", "cut_off", "failed"}, Held: c.held(ctx, caller, q.Team)}
	for _, f := range c.d.InspectFunctions(ctx, caller) {
		if !slices.Contains(data.Teams, f.Team) {
			data.Teams = append(data.Teams, f.Team)
		}
		data.Funcs = append(data.Funcs, f.Name)
	}
	slices.Sort(data.Teams)
	c.render(w, r, http.StatusOK, "turns", page{Title: "Turns", Nav: "turns", Data: data})
}

func (c *Console) turnPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	v, err := c.d.InspectTurn(ctx, httpapi.CallerOf(r), protocol.TurnKey(r.PathValue("key")))
	switch {
	case errors.Is(err, dispatch.ErrNotFound):
		c.render(w, r, http.StatusNotFound, "turn", page{Title: "Turn", Nav: "turns", Error: "No turn with key " + r.PathValue("key") + " (closed turns are kept for two hours)."})
	case errors.Is(err, dispatch.ErrOutOfScope):
		c.render(w, r, http.StatusForbidden, "turn", page{Title: "Turn", Nav: "turns", Error: "This turn calls none of your teams' functions."})
	case err != nil:
		c.inspectError(w, r, "turn", err)
	default:
		c.render(w, r, http.StatusOK, "turn", page{Title: "Turn " + string(v.Key), Nav: "turns", Data: v})
	}
}

func (c *Console) functionsPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	c.render(w, r, http.StatusOK, "functions", page{Title: "Functions", Nav: "functions", Data: c.d.InspectFunctions(ctx, httpapi.CallerOf(r))})
}

func (c *Console) watchesPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	ws, err := c.d.InspectWatches(ctx, httpapi.CallerOf(r))
	if err != nil {
		c.inspectError(w, r, "watches", err)
		return
	}
	c.render(w, r, http.StatusOK, "watches", page{Title: "Watches", Nav: "watches", Data: ws})
}

// held returns the calls awaiting approval caller sees (of team, if set),
// as the approval API shows them; none if they cannot be read, which the
// log says.
func (c *Console) held(ctx context.Context, caller dispatch.Caller, team string) []httpapi.ApprovalView {
	list, err := c.d.Approvals(ctx, caller, dispatch.ApprovalQuery{Team: team})
	if err != nil {
		c.log.WarnContext(ctx, "reading the calls awaiting approval failed", "err", err)
		return nil
	}
	now := time.Now()
	views := make([]httpapi.ApprovalView, len(list))
	for i, a := range list {
		views[i] = httpapi.ViewOf(a, now)
	}
	return views
}

// approvalsData is the approvals page.
type approvalsData struct {
	Team string
	Held []httpapi.ApprovalView
}

func (c *Console) approvalsPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	team := r.URL.Query().Get("team")
	c.render(w, r, http.StatusOK, "approvals", page{Title: "Approvals", Nav: "approvals",
		Data: approvalsData{Team: team, Held: c.held(ctx, httpapi.CallerOf(r), team)}})
}
