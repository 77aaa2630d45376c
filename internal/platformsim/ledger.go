package platformsim

import "time"

// The ledger is the platform's own record of what it asked for and what it
// was given, for soak tests that judge toolrelay from the platform's side:
// every function call the model made, every tool output accepted for it
// (replays of an Idempotency-Key are not acceptances), and how each
// Assistants run ended.

// Ledger is a copy of the simulator's record.
type Ledger struct {
	// Calls lists every call ID the model emitted, with its function.
	Calls map[string]string
	// Asked is when each call was emitted, Answered when each output was
	// accepted (in the order of Outputs).
	Asked map[string]time.Time
	// Platform is the API each call was made on: agents, assistants or
	// responses.
	Platform map[string]string
	Answered map[string][]time.Time
	// Outputs holds, per call ID, every output the platform accepted for
	// it, in order: more than one is a duplicate submission.
	Outputs map[string][]string
	// Runs counts Assistants runs by status (expiry applied).
	Runs map[string]int
}

// ledger is the record the server keeps; s.mu guards it.
type ledger struct {
	calls    map[string]string
	outputs  map[string][]string
	asked    map[string]time.Time
	answered map[string][]time.Time
	platform map[string]string
}

func (l *ledger) init() {
	if l.calls == nil {
		l.calls, l.outputs = map[string]string{}, map[string][]string{}
		l.asked, l.answered, l.platform = map[string]time.Time{}, map[string][]time.Time{}, map[string]string{}
	}
}

// calledAll records the calls the model makes; s.mu is held.
func (s *Server) calledAll(platform string, calls []modelCall) {
	s.book.init()
	now := time.Now()
	for _, c := range calls {
		s.book.calls[c.ID] = c.Name
		s.book.asked[c.ID] = now
		s.book.platform[c.ID] = platform
	}
}

// answered records an accepted output; s.mu is held.
func (s *Server) answered(id, output string) {
	s.book.init()
	s.book.outputs[id] = append(s.book.outputs[id], output)
	s.book.answered[id] = append(s.book.answered[id], time.Now())
}

// Ledger returns a copy of the record.
func (s *Server) Ledger() Ledger {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := Ledger{Calls: map[string]string{}, Outputs: map[string][]string{}, Runs: map[string]int{},
		Asked: map[string]time.Time{}, Answered: map[string][]time.Time{}, Platform: map[string]string{}}
	for id, fn := range s.book.calls {
		l.Calls[id] = fn
		l.Asked[id] = s.book.asked[id]
		l.Platform[id] = s.book.platform[id]
	}
	for id, outs := range s.book.outputs {
		l.Outputs[id] = append([]string(nil), outs...)
		l.Answered[id] = append([]time.Time(nil), s.book.answered[id]...)
	}
	for _, ru := range s.runs {
		s.expire(ru)
		l.Runs[ru.status]++
	}
	return l
}
