package dispatch

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"
	"unicode"

	"github.com/toolrelay/toolrelay/internal/firstwins"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Client-executed tool search: a Responses agent given
// {"type":"tool_search","execution":"client"} asks the client to find
// deferred tools (tool_search_call), and the client answers with the
// definitions found (tool_search_output). The dispatcher is that client:
// it searches the functions served now, and records the matches as the
// call's result, which the adapter renders as tool definitions.

// maxSearchResults bounds the functions one search returns.
const maxSearchResults = 10

// answerSelf records the results of the calls of t the dispatcher answers
// itself without a person (tool searches, MCP approval requests no policy
// holds) that have no result in recorded (nil: none has).
func (d *Dispatcher) answerSelf(ctx context.Context, t *Turn, recorded map[protocol.CallKey]bool) {
	d.answerSearches(ctx, t, recorded)
	d.answerMCPApprovals(ctx, t, recorded)
}

// answerSearches records the result of each tool search of t that has no
// result in recorded (nil: none has).
func (d *Dispatcher) answerSearches(ctx context.Context, t *Turn, recorded map[protocol.CallKey]bool) {
	for i := range t.Calls {
		c := &t.Calls[i]
		if !c.ToolSearch || c.Rejected || recorded[c.Key] {
			continue
		}
		found := SearchFunctions(d.ServedFunctions(func(string) bool { return true }), SearchQuery(c.Arguments))
		out, _ := json.Marshal(found)
		for len(out) > protocol.MaxOutputSize/2 && len(found) > 0 { // large schemas: fewer of them
			found = found[:len(found)-1]
			out, _ = json.Marshal(found)
		}
		res := &protocol.Result{
			Version: protocol.Version, Key: c.Key, CallID: c.ID, Team: c.Team, Function: safeName(c.Name),
			Output: string(out), Executor: "dispatcher/" + d.opts.Name, FinishedAt: time.Now().UTC(),
		}
		if err := firstwins.Record(ctx, d.js.Conn(), res, nil, t.resultTTL(time.Now())); err != nil && ctx.Err() == nil {
			// The replica that resumes the turn answers it again.
			d.log.Error("recording tool search result failed", "turn", t.Key, "call_key", c.Key, "err", err)
			continue
		}
		names := make([]string, len(found))
		for i, s := range found {
			names[i] = s.Name
		}
		d.log.InfoContext(ctx, "tool search answered", "turn", t.Key, "call_id", c.ID, "query", SearchQuery(c.Arguments), "found", names)
	}
}

// SearchQuery is the text a tool search looks for: the strings of its
// arguments (a hosted search's {"query","paths"}, or whatever schema a
// client-executed tool_search declares), joined by spaces; arguments that
// are not JSON are taken as the text itself.
func SearchQuery(args json.RawMessage) string {
	var v any
	if json.Unmarshal(args, &v) != nil {
		return string(args)
	}
	var parts []string
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case string:
			parts = append(parts, v)
		case []any:
			for _, e := range v {
				walk(e)
			}
		case map[string]any:
			keys := make([]string, 0, len(v))
			for k := range v {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			for _, k := range keys {
				walk(v[k])
			}
		}
	}
	walk(v)
	return strings.Join(parts, " ")
}

// stopWords are words of a query that say nothing about a function.
var stopWords = map[string]bool{
	"the": true, "and": true, "for": true, "with": true, "that": true, "this": true, "from": true,
	"what": true, "how": true, "can": true, "you": true, "are": true, "any": true, "get": true,
	"tool": true, "tools": true, "function": true, "functions": true, "find": true, "search": true,
	"need": true, "want": true, "some": true, "about": true, "into": true, "has": true, "have": true,
}

// searchTerms splits a query into the lower-case words a function is
// matched against: words of three letters or more that are not stop words.
func searchTerms(query string) []string {
	var terms []string
	for _, w := range strings.FieldsFunc(strings.ToLower(query), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len([]rune(w)) >= 3 && !stopWords[w] && !slices.Contains(terms, w) {
			terms = append(terms, w)
		}
	}
	return terms
}

// SearchFunctions returns the specs whose name or description matches
// query, best first: a spec named exactly as the query first, then by how
// many of the query's words its name and description hold (a word matches
// a part of one: "refund" matches "issue_refund" and "refunds"), deferred
// functions before others, then by name. At most 10 are returned.
func SearchFunctions(specs []*protocol.FunctionSpec, query string) []*protocol.FunctionSpec {
	q := strings.ToLower(strings.TrimSpace(query))
	terms := searchTerms(q)
	type scored struct {
		spec  *protocol.FunctionSpec
		score int
	}
	var hits []scored
	for _, s := range specs {
		name := strings.ToLower(s.Name)
		text := strings.ReplaceAll(name, "_", " ") + " " + strings.ToLower(s.Description)
		score := 0
		if q != "" && (name == q || name == strings.ReplaceAll(q, " ", "_")) {
			score = 1000
		}
		for _, term := range terms {
			if strings.Contains(text, term) {
				score++
			}
		}
		if score > 0 {
			hits = append(hits, scored{s, score})
		}
	}
	slices.SortStableFunc(hits, func(a, b scored) int {
		switch {
		case a.score != b.score:
			return b.score - a.score
		case a.spec.DeferLoading != b.spec.DeferLoading:
			if a.spec.DeferLoading {
				return -1
			}
			return 1
		}
		return strings.Compare(a.spec.Name, b.spec.Name)
	})
	out := make([]*protocol.FunctionSpec, 0, min(len(hits), maxSearchResults))
	for _, h := range hits[:min(len(hits), maxSearchResults)] {
		out = append(out, h.spec)
	}
	return out
}
