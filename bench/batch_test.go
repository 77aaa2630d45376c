package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// BenchmarkTwoWrites weighs JetStream's atomic batch publish (ADR-50)
// against what intake does now, for the two messages a turn stores
// together (a record created by compare-and-set and a smaller second
// message): two asynchronous publications awaited together, or one
// batch of two committed at once. File storage and one replica, as
// toolrelay's default; 48 writers at once.
//
//	cd bench && go test -run '^$' -bench TwoWrites -benchtime 5000x
func BenchmarkTwoWrites(b *testing.B) {
	for _, mode := range []string{"async-pair", "atomic-batch"} {
		b.Run(mode, func(b *testing.B) {
			env, err := startNATS(b.Context(), config{})
			if err != nil {
				b.Fatal(err)
			}
			defer env.close()
			nc, js, err := env.connect("two-writes")
			if err != nil {
				b.Fatal(err)
			}
			defer nc.Close()
			if _, err := js.CreateStream(b.Context(), jetstream.StreamConfig{Name: "TWO", Subjects: []string{"two.>"},
				Storage: jetstream.FileStorage, MaxMsgsPerSubject: 1, AllowAtomicPublish: true}); err != nil {
				b.Fatal(err)
			}
			write := writePair
			if mode == "atomic-batch" {
				write = writeBatch
			}
			record, second := make([]byte, 600), make([]byte, 100)
			// A fixed number of writers, whatever GOMAXPROCS: the server
			// takes at most 50 atomic batches in flight per stream.
			const writers = 48
			var n atomic.Int64
			var wg sync.WaitGroup
			cpu0 := cpuTime()
			b.ResetTimer()
			for range writers {
				wg.Go(func() {
					for {
						i := n.Add(1)
						if i > int64(b.N) {
							return
						}
						if err := write(b.Context(), nc, js, strconv.FormatInt(i, 10), record, second); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/turn")
			info, err := js.Stream(b.Context(), "TWO")
			if err != nil {
				b.Fatal(err)
			}
			if got := info.CachedInfo().State.Msgs; got != uint64(2*b.N) {
				b.Fatalf("stored %d messages, want %d", got, 2*b.N)
			}
		})
	}
}

func writePair(ctx context.Context, _ *nats.Conn, js jetstream.JetStream, key string, record, second []byte) error {
	a, err := js.PublishMsgAsync(&nats.Msg{Subject: "two.rec." + key, Data: record,
		Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: {"0"}}})
	if err != nil {
		return err
	}
	c, err := js.PublishMsgAsync(&nats.Msg{Subject: "two.tim." + key, Data: second})
	if err != nil {
		return err
	}
	for _, f := range []jetstream.PubAckFuture{a, c} {
		if _, err := awaitFuture(ctx, f); err != nil {
			return err
		}
	}
	return nil
}

// writeBatch sets the batch headers itself: nats.go has no batch API.
func writeBatch(ctx context.Context, nc *nats.Conn, _ jetstream.JetStream, key string, record, second []byte) error {
	id := "b" + key
	if err := nc.PublishMsg(&nats.Msg{Subject: "two.rec." + key, Data: record, Header: nats.Header{
		jetstream.ExpectedLastSubjSeqHeader: {"0"}, "Nats-Batch-Id": {id}, "Nats-Batch-Sequence": {"1"}}}); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := nc.RequestMsgWithContext(ctx, &nats.Msg{Subject: "two.tim." + key, Data: second, Header: nats.Header{
		"Nats-Batch-Id": {id}, "Nats-Batch-Sequence": {"2"}, "Nats-Batch-Commit": {"1"}}})
	if err != nil {
		return err
	}
	var ack struct {
		Seq   uint64 `json:"seq"`
		Batch string `json:"batch"`
		Count int    `json:"count"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil || ack.Seq == 0 || ack.Batch != id || ack.Count != 2 {
		return fmt.Errorf("batch not committed: %s", resp.Data)
	}
	return nil
}
