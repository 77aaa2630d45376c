package tenancy

import "github.com/toolrelay/toolrelay/pkg/protocol"

// Defaults of the limits, sane for about 100 teams on one deployment; see
// docs/security.md, "Shared resources", for what each bounds and how an
// operator sees it reached.
const (
	DefaultTeamMaxFile = 1 << 30 // bytes of file storage per team
	// DefaultTeamMaxMemory is small: toolrelay stores nothing in memory,
	// and the server reserves each account's limit whether it is used or
	// not, refusing JetStream to every account once they add up to more
	// than its max_memory_store (75% of the memory by default).
	DefaultTeamMaxMemory     = 1 << 20 // bytes of memory storage per team
	DefaultTeamMaxStreams    = 16
	DefaultTeamMaxConsumers  = 1024
	DefaultTeamMaxAckPending = 100000
	// A team's subscriptions cost the server about 0.5 KiB each (300,000
	// on one connection grew its RSS by 157 MB), and the server bounds them
	// per connection only: a team holds at most MaxConnections ×
	// MaxSubscriptions of them, 1M (about 0.5 GiB) by default. An executor
	// uses 2 plus 1 per function it serves.
	DefaultTeamMaxConnections   = 256
	DefaultTeamMaxSubscriptions = 4096
	// DefaultTeamMaxPayload is the largest message a team's connection may
	// publish: an envelope (protocol.MaxEnvelopeSize), and so also the
	// largest declaration request.
	DefaultTeamMaxPayload = protocol.MaxEnvelopeSize

	// DefaultControlStateBytes is the file storage the control account has
	// beyond its result streams: turn records, timers, watches, the
	// registry, the declarations, approvals and the audit trail (at most
	// dispatch.DefaultAuditBytes).
	DefaultControlStateBytes = 4 << 30
	// DefaultControlMaxMemory bounds the control account's memory storage;
	// the dispatchers store everything in files.
	DefaultControlMaxMemory = 64 << 20
	// DefaultControlStreamsSpare is the control account's streams beyond
	// one result stream per team: its own eleven (the timer and audit
	// streams and nine buckets), and room to grow.
	DefaultControlStreamsSpare = 64
	// DefaultControlMaxConsumers bounds the control account's consumers:
	// one per result stream and dispatcher replica, a few per replica for
	// the streams they share, and one per key-value watch of each replica.
	DefaultControlMaxConsumers = 4096

	// DefaultMaxPending bounds what the server buffers for one connection
	// that does not read (then it closes it as a slow consumer). The
	// server's own default is 64 MiB; per team it is multiplied by
	// MaxConnections.
	DefaultMaxPending = 32 << 20
)

// Limits bound what one team's account may hold and do. The zero value
// takes the defaults.
type Limits struct {
	// MaxFile bounds the team's file storage (calls, dead letters,
	// attempts). Default: DefaultTeamMaxFile (1 GiB).
	MaxFile int64
	// MaxMemory bounds its memory storage. Default: DefaultTeamMaxMemory
	// (1 MiB).
	MaxMemory int64
	// MaxStreams and MaxConsumers bound its streams and consumers.
	// Defaults: 16 and 1024.
	MaxStreams, MaxConsumers int
	// MaxAckPending bounds the team's calls in flight (delivered, not yet
	// acknowledged) across all its consumers. Default: 100000.
	MaxAckPending int
	// MaxConnections bounds its connections. Default: 256.
	MaxConnections int
	// MaxSubscriptions bounds the subscriptions of each of its
	// connections (the server has no bound per account). Default: 4096.
	MaxSubscriptions int
	// MaxPayload bounds a message one of its connections publishes.
	// Default: DefaultTeamMaxPayload (1 MiB).
	MaxPayload int
}

func (l Limits) withDefaults() Limits {
	def(&l.MaxFile, DefaultTeamMaxFile)
	def(&l.MaxMemory, DefaultTeamMaxMemory)
	def(&l.MaxStreams, DefaultTeamMaxStreams)
	def(&l.MaxConsumers, DefaultTeamMaxConsumers)
	def(&l.MaxAckPending, DefaultTeamMaxAckPending)
	def(&l.MaxConnections, DefaultTeamMaxConnections)
	def(&l.MaxSubscriptions, DefaultTeamMaxSubscriptions)
	def(&l.MaxPayload, DefaultTeamMaxPayload)
	return l
}

// ControlLimits bound the control account's JetStream use, so that no
// write of the control plane (a flood of declarations it stores for a
// team, a bug) takes more of the servers' disk, memory, streams or
// consumers than the operator gave it. They bound the account as a whole:
// how the control plane shares them between teams is the dispatchers'
// (their per-team settings). The zero value takes the defaults.
type ControlLimits struct {
	// MaxFile bounds its file storage, across replicas (the server counts
	// a stream of 3 replicas 3 times). It must hold every team's result
	// stream, whose size the server reserves in full when the dispatcher
	// creates it, and the dispatchers' own state. Default: replicas ×
	// ((teams + 1) × ResultBytes + DefaultControlStateBytes), about 29 GiB
	// for 100 teams on one server.
	MaxFile int64
	// MaxMemory bounds its memory storage. Default: 64 MiB.
	MaxMemory int64
	// MaxStreams bounds its streams. Default: teams + 64.
	MaxStreams int
	// MaxConsumers bounds its consumers. Default: 4096.
	MaxConsumers int
}

func (l ControlLimits) withDefaults(teams, replicas int, resultBytes int64) ControlLimits {
	def(&l.MaxFile, int64(replicas)*(int64(teams+1)*resultBytes+DefaultControlStateBytes))
	def(&l.MaxMemory, DefaultControlMaxMemory)
	def(&l.MaxStreams, teams+DefaultControlStreamsSpare)
	def(&l.MaxConsumers, DefaultControlMaxConsumers)
	return l
}

// def sets *v to d unless it is positive.
func def[T int | int64](v *T, d T) {
	if *v <= 0 {
		*v = d
	}
}
