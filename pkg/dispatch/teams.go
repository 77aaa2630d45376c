package dispatch

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// teamAPIs are the JetStream APIs of the teams' accounts as the dispatcher
// reaches them. What a team's executors keep (its call stream and its
// consumers, its dead letters) is in the team's account: the dispatcher's
// own in a single-account deployment, else one the control account reaches
// only through the read-only imports dispatcher nats-config writes under a
// prefix of the team's (Options.TeamAPIPrefix).
type teamAPIs struct {
	js       jetstream.JetStream
	template string // Options.TeamAPIPrefix; empty: js's own account

	mu     sync.Mutex
	byTeam map[string]jetstream.JetStream
}

func newTeamAPIs(js jetstream.JetStream, template string) (*teamAPIs, error) {
	if template != "" && !strings.Contains(template, "{team}") {
		return nil, fmt.Errorf("dispatch: TeamAPIPrefix %q has no {team}", template)
	}
	return &teamAPIs{js: js, template: template, byTeam: map[string]jetstream.JetStream{}}, nil
}

// TeamJetStream returns the JetStream API of team's account as the
// dispatcher reaches it: its own (the one New was given) when
// Options.TeamAPIPrefix is empty, else the same connection under team's
// prefix, where a deployment made by dispatcher nats-config allows only
// the info of team's call and dead-letter streams, its call stream's
// consumers and direct gets of its dead letters. Publishing through it is
// not prefixed: a replayed call goes where the dispatcher's calls go. It is
// safe for concurrent use; the error is for a team name that is not
// valid.
func (d *Dispatcher) TeamJetStream(team string) (jetstream.JetStream, error) {
	t := d.teamAPIs
	if t.template == "" {
		return t.js, nil
	}
	if err := protocol.ValidateTeamName(team); err != nil {
		return nil, fmt.Errorf("dispatch: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if js := t.byTeam[team]; js != nil {
		return js, nil
	}
	js, err := jetstream.NewWithAPIPrefix(t.js.Conn(), protocol.TeamAPIPrefix(t.template, team))
	if err != nil {
		return nil, fmt.Errorf("dispatch: JetStream API of team %s: %w", team, err)
	}
	t.byTeam[team] = js
	return js, nil
}

// Teams lists, sorted, the teams this dispatcher knows of: those that
// claim a function in the registry and those with a result stream.
func (d *Dispatcher) Teams() []string {
	teams := append(d.registry.teams(), d.gather.streams.teams()...)
	slices.Sort(teams)
	teams = slices.Compact(teams)
	return slices.DeleteFunc(teams, func(t string) bool { return t == protocol.SystemTeam })
}

// teams lists the teams that claim a function, unsorted, with repeats.
func (r *registry) teams() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]string, 0, len(r.owners))
	for _, spec := range r.owners {
		out = append(out, spec.Team)
	}
	return out
}

// teams lists the teams whose result streams this replica has.
func (r *resultStreams) teams() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.streams))
	for team := range r.streams {
		out = append(out, team)
	}
	return out
}
