package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/provision"
)

// The floor with toolrelay's writes: the pipeline of floor.go plus what
// toolrelay stores for a single-call turn to keep its guarantees, in the
// same order and with the same waits, by no toolrelay code. The turn
// record created by compare-and-set (held by the replica taking it in)
// beside its deadline timer (both awaited before the call goes out), a
// message ID and a TTL on the call, a message ID and a first-wins
// expectation on the result (stored before the call is acknowledged), the
// compare-and-set that records the submission and the roll-up marker that
// removes the timer. What toolrelay costs beyond this
// is its own code; what this costs beyond the floor, the guarantees'
// writes.

// turnRecord mimics the record of a turn of n calls: about 400 bytes and
// 200 more per call.
func turnRecord(n int) []byte {
	const call = `{"id":"call_hTthyt3Sx8AzZZi3qmgYfH1O","name":"noop","key":"891ba37957aad57674e84d4889f5b53a.e1e1856e112d8be5","team":"bench","arguments":{"order_id":"A-1001","carrier":"ups"}}`
	calls := strings.Repeat(call+",", n)
	return []byte(`{"v":1,"key":"891ba37957aad57674e84d4889f5b53a","ref":{"platform":"responses","response_id":"resp_AiFWKCbrNoE2KGEoYn7ep1Dy"},` +
		`"scope":"resp_AiFWKCbrNoE2KGEoYn7ep1Dy","state":"collecting","created_at":"2026-01-01T00:00:01Z","expires_at":"2026-01-01T00:10:01Z",` +
		`"deadline":"2026-01-01T00:09:31Z","calls":[` + calls[:len(calls)-1] + `]}`)
}

type writesPipeline struct {
	js      jetstream.JetStream
	kv      jetstream.KeyValue
	mu      sync.Mutex
	waiting map[string]chan struct{} // by call key: its turn's results
	stop    func()
	env     *natsEnv
}

func newWritesPipeline(ctx context.Context, env *natsEnv) (*writesPipeline, error) {
	_, js, err := env.connect("writes-dispatcher")
	if err != nil {
		return nil, err
	}
	popts := provision.Options{}
	calls, err := js.CreateStream(ctx, provision.CallStreamConfig("bench", popts))
	if err != nil {
		return nil, err
	}
	results, err := js.CreateStream(ctx, provision.ResultStreamConfig("bench", 0, popts))
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateStream(ctx, provision.TimerStreamConfig(popts)); err != nil {
		return nil, err
	}
	kv, err := js.CreateKeyValue(ctx, provision.TurnBucketConfig(popts).KeyValueConfig)
	if err != nil {
		return nil, err
	}
	p := &writesPipeline{js: js, kv: kv, waiting: map[string]chan struct{}{}, env: env}
	stopped := make(chan struct{}) // ends the executor's waits for acknowledgements

	// The executor, on its own connection: the result is stored, first
	// wins, before the call is acknowledged.
	_, wjs, err := env.connect("writes-executor")
	if err != nil {
		return nil, err
	}
	wc, err := calls.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "noop", FilterSubject: "fncall.bench.noop", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	wcc, err := wc.Consume(func(m jetstream.Msg) {
		key := m.Headers().Get("Key")
		res := &nats.Msg{Subject: "fnresult.bench." + key, Data: m.Data(), Header: nats.Header{}}
		f, err := wjs.PublishMsgAsync(res, jetstream.WithMsgID("result."+key), jetstream.WithExpectLastSequencePerSubject(0))
		if err != nil {
			_ = m.Nak()
			return
		}
		go func() {
			select {
			case <-f.Ok():
				_ = m.Ack()
			case <-f.Err():
				_ = m.Nak()
			case <-stopped:
			}
		}()
	})
	if err != nil {
		return nil, err
	}
	rc, err := results.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "gather", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		return nil, err
	}
	rcc, err := rc.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		key := m.Subject()[len("fnresult.bench."):]
		p.mu.Lock()
		ch := p.waiting[key]
		delete(p.waiting, key)
		p.mu.Unlock()
		if ch != nil {
			ch <- struct{}{}
		}
	})
	if err != nil {
		return nil, err
	}
	p.stop = func() { wcc.Stop(); rcc.Stop(); close(stopped); js.Conn().Close(); wjs.Conn().Close() }
	return p, nil
}

// turn runs the writes of one turn of n calls, waiting where toolrelay
// waits: the calls go out once the record and the timer are stored, and
// the close once every result is in.
func (p *writesPipeline) turn(ctx context.Context, key string, n int, record []byte) error {
	timerSubject := provision.TimerSubjectPrefix + ".sched." + key
	timer, err := p.js.PublishAsync(timerSubject, []byte(key), jetstream.WithMsgID("timer."+key),
		jetstream.WithScheduleAt(time.Now().Add(10*time.Minute)),
		jetstream.WithScheduleTarget(provision.TimerSubjectPrefix+".fire."+key))
	if err != nil {
		return err
	}
	created, err := p.js.PublishAsync("$KV."+provision.TurnBucket+"."+key, record, jetstream.WithExpectLastSequencePerSubject(0))
	if err != nil {
		return err
	}
	rev, err := awaitFuture(ctx, created)
	if err != nil {
		return err
	}
	if _, err := awaitFuture(ctx, timer); err != nil {
		return err
	}
	results := make(chan struct{}, n)
	sent := make([]jetstream.PubAckFuture, n)
	for i := range n {
		callKey := fmt.Sprintf("%s.c%02d", key, i)
		p.mu.Lock()
		p.waiting[callKey] = results
		p.mu.Unlock()
		call := &nats.Msg{Subject: "fncall.bench.noop", Data: payload, Header: nats.Header{"Key": {callKey}}}
		if sent[i], err = p.js.PublishMsgAsync(call, jetstream.WithMsgID("call."+callKey), jetstream.WithMsgTTL(11*time.Minute)); err != nil {
			return err
		}
	}
	for _, f := range sent {
		if _, err := awaitFuture(ctx, f); err != nil {
			return err
		}
	}
	for range n {
		select {
		case <-results:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// The record was created held (claimed by the replica that took the
	// turn in), so the close is one compare-and-set: submitted.
	if _, err = p.kv.Update(ctx, key, record, rev); err != nil {
		return err
	}
	marker := nats.NewMsg(timerSubject)
	marker.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
	marker.Header.Set(jetstream.MsgTTLHeader, "1s")
	return p.js.Conn().PublishMsg(marker)
}

func awaitFuture(ctx context.Context, f jetstream.PubAckFuture) (uint64, error) {
	select {
	case ack := <-f.Ok():
		return ack.Sequence, nil
	case err := <-f.Err():
		return 0, err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

func measureWrites(ctx context.Context, cfg config, r *report) error {
	env, err := startNATS(ctx, cfg)
	if err != nil {
		return err
	}
	defer env.close()
	p, err := newWritesPipeline(ctx, env)
	if err != nil {
		return err
	}
	defer p.stop()
	for _, size := range []int{1, 16} {
		if err := p.measure(ctx, cfg, r, size); err != nil {
			return fmt.Errorf("writes, turns of %d: %w", size, err)
		}
	}
	return nil
}

// measure runs cfg.calls calls in turns of size, inflightCalls at a time.
func (p *writesPipeline) measure(ctx context.Context, cfg config, r *report, size int) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	turns, record := cfg.calls/size, turnRecord(size)
	slots := make(chan struct{}, max(inflightCalls/size, 16))
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	start, cpu0, alloc0, msgs0 := time.Now(), cpuTime(), allocated(), p.env.traffic()
	for i := 0; i < turns && ctx.Err() == nil; i++ {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			if err := p.turn(ctx, fmt.Sprintf("s%02dt%08d", size, i), size, record); err != nil {
				select {
				case errs <- err:
				default:
				}
				cancel()
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
	}
	calls := turns * size
	w := e2eResult{size: size, calls: float64(calls) / time.Since(start).Seconds(), cpu: (cpuTime() - cpu0) / time.Duration(calls),
		alloc: alloc0.per(calls), msgs: msgs0.per(p.env, calls)}
	w.turns = w.calls / float64(size)
	r.writes = append(r.writes, w)
	fmt.Printf("   writes, turns of %2d: %.0f calls/s, %s CPU per call, %s allocated per call, server messages per call %s\n", size, w.calls, usf(w.cpu), w.alloc, w.msgs)
	return nil
}
