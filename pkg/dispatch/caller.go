package dispatch

import (
	"log/slog"
	"slices"
	"strings"
)

// Caller is who asks the dispatcher for something (a request to its HTTP
// API, a page of the console) and what it may see.
type Caller struct {
	// Name identifies the caller in logs: the name of its token, or
	// "loopback" when the API takes no tokens.
	Name string
	// Admin callers see everything.
	Admin bool
	// Teams are what a caller that is not an admin may see: the functions
	// of these teams, their calls and results.
	Teams []string
	// ToolsOnly callers may list and call the tools of Teams (/mcp and
	// GET /v1/tools) and reach nothing else: the scope to give an agent,
	// which needs its tools, not the calls and dead letters of their teams.
	ToolsOnly bool
}

// Sees reports whether c may see what belongs to team.
func (c Caller) Sees(team string) bool {
	return c.Admin || slices.Contains(c.Teams, team)
}

// LogValue shows the caller's name and scope, never a credential.
func (c Caller) LogValue() slog.Value {
	scope := "admin"
	switch {
	case c.ToolsOnly:
		scope = "tools:" + strings.Join(c.Teams, ",")
	case !c.Admin:
		scope = "teams:" + strings.Join(c.Teams, ",")
	}
	return slog.GroupValue(slog.String("name", c.Name), slog.String("scope", scope))
}
