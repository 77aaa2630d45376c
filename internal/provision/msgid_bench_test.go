package provision

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// BenchmarkServerHeapPerMessageID measures what a message ID costs the
// server's heap while its stream's duplicates window holds it: results
// published on a team's results stream with and without Nats-Msg-Id, the
// difference per message. The server runs in this process, as the
// dispatcher's embedded default does. Run with a large count:
//
//	go test -run '^$' -bench ServerHeapPerMessageID -benchtime 200000x ./internal/provision/
func BenchmarkServerHeapPerMessageID(b *testing.B) {
	perMsg := map[bool]float64{}
	for _, withID := range []bool{false, true} {
		b.Run(fmt.Sprintf("msgid=%t", withID), func(b *testing.B) {
			_, js := natstest.Start(b).Connect(b)
			if _, err := Stream(b.Context(), js, ResultStreamConfig("bench", 0, Options{})); err != nil {
				b.Fatal(err)
			}
			before := liveHeap()
			b.ResetTimer()
			futures := make([]jetstream.PubAckFuture, 0, 1000)
			for i := range b.N {
				key := protocol.CallKey(fmt.Sprintf("%032x.%016x", i, i))
				m := &nats.Msg{Subject: protocol.ResultSubject("bench", key), Data: []byte(`{"v":2}`),
					Header: nats.Header{jetstream.ExpectedLastSubjSeqHeader: []string{"0"}}}
				if withID {
					m.Header.Set(jetstream.MsgIDHeader, protocol.ResultMsgID(key))
				}
				f, err := js.PublishMsgAsync(m)
				if err != nil {
					b.Fatal(err)
				}
				if futures = append(futures, f); len(futures) == cap(futures) || i == b.N-1 {
					for _, f := range futures {
						select {
						case <-f.Ok():
						case err := <-f.Err():
							b.Fatal(err)
						}
					}
					futures = futures[:0]
				}
			}
			b.StopTimer()
			perMsg[withID] = float64(liveHeap()-before) / float64(b.N)
			b.ReportMetric(perMsg[withID], "heap-B/msg")
		})
	}
	if len(perMsg) == 2 {
		b.Logf("a message ID costs the server %.0f bytes of heap while the window holds it", perMsg[true]-perMsg[false])
	}
}

func liveHeap() int64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}
