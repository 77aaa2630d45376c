package jspub

import (
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Async publishes to JetStream without waiting for each acknowledgement, as
// jetstream's PublishMsgAsync does, and reads the acknowledgements as
// Publish does: nats.go decodes each with encoding/json into a PubAck, and
// hands it over through channels made for it, which was several objects and
// a reflective decode per publication on a path that makes three of them
// per turn.
//
// It keeps jetstream's behaviour where callers can see it: one wildcard
// reply subscription, an answer of "no responders" (a stream leader being
// elected) published again jetstream.DefaultPubRetryAttempts times,
// jetstream.DefaultPubRetryWait apart, then jetstream.ErrNoStreamResponse;
// an error the server answers is its *jetstream.APIError; a publication
// pending when the connection starts reconnecting fails with
// nats.ErrDisconnected (its answer, if any, is lost with the connection);
// and at most maxPending publications wait for answers, a publisher over
// that waiting up to stallWait for one to come in, then getting
// jetstream.ErrTooManyStalledMsgs. A publication whose answer does not
// come within its timeout (lost with a server, the connection never
// dropped) fails with jetstream.ErrAsyncPublishTimeout, as with
// jetstream's WithPublishAsyncTimeout, but without a timer each: one
// ticker looks at what is pending.
type Async struct {
	nc         *nats.Conn
	maxPending int
	timeout    time.Duration

	mu        sync.Mutex
	prefix    string // the reply subjects', set up at the first publication
	sub       *nats.Subscription
	status    chan nats.Status
	listening sync.WaitGroup // the status listener and timeout ticker
	stop      chan struct{}  // closed by Close
	pending   map[string]*Future
	next      uint64
	freed     chan struct{} // closed when a slot frees; nil if nobody waits
	closed    bool
}

const (
	// stallWait is how long a publication waits for a slot (jetstream's
	// default).
	stallWait = 200 * time.Millisecond
	// timeoutTicks is how many times per timeout pending publications are
	// looked at: one fails between timeout and timeout plus a tick.
	timeoutTicks = 20
)

// NewAsync returns a publisher on nc with at most maxPending publications
// waiting for answers, each failed timeout after it went out if none came.
// It subscribes at its first publication.
func NewAsync(nc *nats.Conn, maxPending int, timeout time.Duration) *Async {
	return &Async{nc: nc, maxPending: max(maxPending, 1), timeout: timeout, pending: map[string]*Future{}, stop: make(chan struct{})}
}

// Future is a publication's answer to come.
type Future struct {
	msg   *nats.Msg // as it goes out, with its reply subject
	token string
	sent  time.Time
	done  chan struct{}
	// Set before done is closed.
	seq uint64
	err error
	// retries counts the publications again after "no responders"; retry
	// is the timer of the next. Both under the publisher's lock.
	retries int
	retry   *time.Timer
}

// Done is closed once the answer is in (or the publication failed).
func (f *Future) Done() <-chan struct{} { return f.done }

// Result is the stream sequence the message is stored at, or why it was
// not: valid once Done is closed.
func (f *Future) Result() (uint64, error) { return f.seq, f.err }

// Publish sends m and returns its answer to come. m must have no reply
// subject; its headers are the caller's to set, as for Publish.
func (a *Async) Publish(m *nats.Msg) (*Future, error) {
	if m.Reply != "" {
		return nil, jetstream.ErrAsyncPublishReplySubjectSet
	}
	a.mu.Lock()
	if err := a.setUp(); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	if err := a.awaitSlot(); err != nil {
		a.mu.Unlock()
		return nil, err
	}
	a.next++
	reply := strconv.AppendUint(append(make([]byte, 0, len(a.prefix)+12), a.prefix...), a.next, 36)
	f := &Future{done: make(chan struct{}), sent: time.Now()}
	f.msg = &nats.Msg{Subject: m.Subject, Reply: string(reply), Header: m.Header, Data: m.Data}
	f.token = f.msg.Reply[len(a.prefix):]
	a.pending[f.token] = f
	a.mu.Unlock()
	if err := a.nc.PublishMsg(f.msg); err != nil {
		a.mu.Lock()
		a.drop(f)
		a.mu.Unlock()
		return nil, err
	}
	return f, nil
}

// setUp subscribes to the answers and listens for reconnects, once; a.mu
// is held.
func (a *Async) setUp() error {
	if a.closed {
		return nats.ErrConnectionClosed
	}
	if a.sub != nil {
		return nil
	}
	// Listen first: a connection closing from here on tells the listener;
	// one closed before is seen closed.
	status := a.nc.StatusChanged(nats.RECONNECTING, nats.CLOSED)
	if a.nc.IsClosed() {
		a.nc.RemoveStatusListener(status)
		return nats.ErrConnectionClosed
	}
	prefix := a.nc.NewInbox() + "." // the connection's inbox prefix, as its permissions allow
	sub, err := a.nc.Subscribe(prefix+"*", a.answer)
	if err != nil {
		a.nc.RemoveStatusListener(status)
		return err
	}
	a.prefix, a.sub = prefix, sub
	a.status = status
	a.listening.Go(func() { a.listen(a.status) })
	return nil
}

// awaitSlot waits, a.mu held (and released while it waits), until fewer
// than maxPending publications are pending, for up to stallWait.
func (a *Async) awaitSlot() error {
	var timeout *time.Timer
	defer func() {
		if timeout != nil {
			timeout.Stop()
		}
	}()
	for len(a.pending) >= a.maxPending {
		if a.freed == nil {
			a.freed = make(chan struct{})
		}
		freed := a.freed
		if timeout == nil {
			timeout = time.NewTimer(stallWait)
		}
		a.mu.Unlock()
		select {
		case <-freed:
			a.mu.Lock()
		case <-timeout.C:
			a.mu.Lock()
			return jetstream.ErrTooManyStalledMsgs
		}
		if a.closed {
			return nats.ErrConnectionClosed
		}
	}
	return nil
}

// answer takes an answer to a publication.
func (a *Async) answer(m *nats.Msg) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(m.Subject) <= len(a.prefix) {
		return
	}
	f := a.pending[m.Subject[len(a.prefix):]]
	if f == nil {
		return // failed already (a reconnect, a timeout), or answered twice
	}
	if len(m.Data) == 0 && m.Header.Get("Status") == "503" { // no responders
		if f.retries < jetstream.DefaultPubRetryAttempts {
			f.retries++
			f.retry = time.AfterFunc(jetstream.DefaultPubRetryWait, func() { a.again(f) })
			return
		}
		a.finish(f, 0, jetstream.ErrNoStreamResponse)
		return
	}
	seq, err := readAsyncAck(m.Data)
	a.finish(f, seq, err)
}

// again publishes f again after "no responders", if it is still pending.
func (a *Async) again(f *Future) {
	a.mu.Lock()
	pending := a.pending[f.token] == f
	a.mu.Unlock()
	if !pending {
		return
	}
	if err := a.nc.PublishMsg(f.msg); err != nil {
		a.mu.Lock()
		if a.pending[f.token] == f {
			a.finish(f, 0, err)
		}
		a.mu.Unlock()
	}
}

// listen fails every pending publication when the connection starts
// reconnecting (their answers are lost with it) or closes, and each one
// still unanswered after its timeout; it returns when the connection
// closes or Close stops it.
func (a *Async) listen(status chan nats.Status) {
	tick := time.NewTicker(max(a.timeout/timeoutTicks, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case s, ok := <-status:
			if !ok {
				return
			}
			err := nats.ErrDisconnected
			if s == nats.CLOSED {
				err = nats.ErrConnectionClosed
			}
			a.mu.Lock()
			a.failAll(err)
			a.mu.Unlock()
			if s == nats.CLOSED {
				return
			}
		case now := <-tick.C:
			a.mu.Lock()
			a.expire(now)
			a.mu.Unlock()
		case <-a.stop:
			return
		}
	}
}

// Close fails every pending publication with nats.ErrConnectionClosed,
// ends the subscription and the listener, and refuses publications from
// then on. It does not close the connection.
func (a *Async) Close() {
	a.mu.Lock()
	if a.closed {
		a.mu.Unlock()
		return
	}
	a.closed = true
	close(a.stop)
	a.failAll(nats.ErrConnectionClosed)
	sub, status := a.sub, a.status
	if a.freed != nil {
		close(a.freed)
		a.freed = nil
	}
	a.mu.Unlock()
	if sub != nil {
		_ = sub.Unsubscribe()
		a.nc.RemoveStatusListener(status)
	}
	a.listening.Wait()
}

// Pending is how many publications wait for their answers.
func (a *Async) Pending() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.pending)
}

// finish gives f its answer; a.mu is held.
func (a *Async) finish(f *Future, seq uint64, err error) {
	a.drop(f)
	f.seq, f.err = seq, err
	close(f.done)
}

// drop takes f out of the pending publications; a.mu is held.
func (a *Async) drop(f *Future) {
	delete(a.pending, f.token)
	if f.retry != nil {
		f.retry.Stop()
	}
	if a.freed != nil {
		close(a.freed)
		a.freed = nil
	}
}

func (a *Async) failAll(err error) {
	for _, f := range a.pending {
		a.finish(f, 0, err)
	}
}

// expire fails the publications still unanswered a timeout after they
// went out; a.mu is held.
func (a *Async) expire(now time.Time) {
	for _, f := range a.pending {
		if now.Sub(f.sent) >= a.timeout {
			a.finish(f, 0, jetstream.ErrAsyncPublishTimeout)
		}
	}
}
