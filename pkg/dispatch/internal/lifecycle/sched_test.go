package lifecycle

import (
	"container/heap"
	"context"
	"math/rand/v2"
	"slices"
	"time"
)

// sched runs simulated threads one at a time, in an order drawn from a
// seeded source, on a virtual clock: the same seed gives the same run.
// A thread runs until it calls into the simulation (every Env method is
// such a point), where it hands control back; time moves only when no
// thread can run, to the next timer.
type sched struct {
	rng   *rand.Rand
	now   time.Time
	ready []*thread
	timers
	seq  int
	back chan struct{} // the running thread hands control back
	cur  *thread
	// steps counts the threads resumed, to bound a run.
	steps int
	// panicked hears of a thread that panicked.
	panicked func(any)
}

type thread struct {
	proc   *proc
	resume chan bool // false: the process was killed, exit
	// sleeping is set while the thread waits in a timer; woken reports
	// whether it was woken by its time (true) or its context (false).
	sleeping bool
	woken    bool
	done     bool
	// lastNow is when the thread last read the clock: the engine reads
	// it to look at a lease.
	lastNow time.Time
}

// errKilled unwinds a thread whose process was killed.
type errKilled struct{}

type timer struct {
	at   time.Time
	seq  int
	th   *thread // a sleeping thread, or
	f    func()  // a callback run by the scheduler
	proc *proc
	dead bool
}

type timers []*timer

func (h timers) Len() int { return len(h) }
func (h timers) Less(i, j int) bool {
	if !h[i].at.Equal(h[j].at) {
		return h[i].at.Before(h[j].at)
	}
	return h[i].seq < h[j].seq
}
func (h timers) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *timers) Push(x any)   { *h = append(*h, x.(*timer)) }
func (h *timers) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newSched(seed uint64, start time.Time) *sched {
	return &sched{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), now: start, back: make(chan struct{})}
}

// spawn starts f as a thread of p, runnable at once.
func (s *sched) spawn(p *proc, f func(context.Context)) {
	th := &thread{proc: p, resume: make(chan bool)}
	go func() {
		defer func() {
			if r := recover(); r != nil {
				if _, ok := r.(errKilled); !ok && s.panicked != nil {
					s.panicked(r)
				}
			}
			th.done = true
			s.back <- struct{}{}
		}()
		if !<-th.resume {
			panic(errKilled{})
		}
		f(p.ctx)
	}()
	s.ready = append(s.ready, th)
}

// at runs f in the scheduler at time t (unless p, if not nil, is dead
// by then).
func (s *sched) at(t time.Time, p *proc, f func()) *timer {
	s.seq++
	tm := &timer{at: t, seq: s.seq, f: f, proc: p}
	heap.Push(&s.timers, tm)
	return tm
}

// yield hands control back from the running thread; it returns once the
// scheduler resumes it.
func (s *sched) yield() {
	th := s.cur
	s.ready = append(s.ready, th)
	s.park(th)
}

func (s *sched) park(th *thread) {
	s.back <- struct{}{}
	if !<-th.resume {
		panic(errKilled{})
	}
}

// sleep parks the running thread for d, or until its process stops.
func (s *sched) sleep(d time.Duration) bool {
	th := s.cur
	if th.proc.stopped {
		return false
	}
	s.seq++
	heap.Push(&s.timers, &timer{at: s.now.Add(max(d, 0)), seq: s.seq, th: th, proc: th.proc})
	th.sleeping = true
	s.park(th)
	return th.woken
}

// wakeSleepers wakes p's sleeping threads early (p is stopping).
func (s *sched) wakeSleepers(p *proc) {
	for _, tm := range s.timers {
		if tm.th != nil && tm.proc == p && !tm.dead {
			tm.dead = true
			tm.th.sleeping, tm.th.woken = false, false
			s.ready = append(s.ready, tm.th)
		}
	}
}

// run schedules threads until none is left and no timer is due before
// end, or maxSteps threads were resumed.
func (s *sched) run(end time.Time, maxSteps int) {
	for s.steps < maxSteps {
		if len(s.ready) == 0 {
			if len(s.timers) == 0 || s.timers[0].at.After(end) {
				return
			}
			tm := heap.Pop(&s.timers).(*timer)
			if tm.dead {
				continue
			}
			if tm.at.After(s.now) {
				s.now = tm.at
			}
			switch {
			case tm.th != nil:
				if tm.th.sleeping {
					tm.th.sleeping, tm.th.woken = false, true
				}
				s.ready = append(s.ready, tm.th)
			case tm.proc == nil || !tm.proc.dead:
				tm.f()
			}
			continue
		}
		i := s.rng.IntN(len(s.ready))
		th := s.ready[i]
		s.ready[i] = s.ready[len(s.ready)-1]
		s.ready = s.ready[:len(s.ready)-1]
		if th.proc.dead {
			th.resume <- false
			<-s.back
			continue
		}
		if th.proc.pausedUntil.After(s.now) {
			s.seq++
			heap.Push(&s.timers, &timer{at: th.proc.pausedUntil, seq: s.seq, th: th, proc: th.proc})
			continue
		}
		s.steps++
		s.cur = th
		if slices.Contains(s.ready, th) {
			panic("a thread is twice in the ready list")
		}
		th.resume <- true
		<-s.back
		s.cur = nil
	}
}

// killAll ends every parked thread, so no goroutine outlives the run.
func (s *sched) killAll() {
	for _, th := range s.ready {
		if !th.done {
			th.resume <- false
			<-s.back
		}
	}
	s.ready = nil
	for _, tm := range s.timers {
		if tm.th != nil && !tm.dead && !tm.th.done {
			tm.dead = true
			tm.th.resume <- false
			<-s.back
		}
	}
	s.timers = nil
}
