package dispatch_test

import (
	"encoding/json"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/lease"
	"github.com/toolrelay/toolrelay/internal/platformsim"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// BenchmarkRenewDeclarations renews one executor process's 1,000
// declarations, as its keeper does every protocol.LeaseRenewal.
func BenchmarkRenewDeclarations(b *testing.B) {
	const n = 1000
	e := newEnvWith(b, platformsim.Options{})
	d, _ := e.dispatcher(dispatch.Options{})
	now := time.Now().UTC()
	decls := make([]*protocol.Declaration, n)
	for i := range decls {
		decls[i] = &protocol.Declaration{Version: protocol.Version, Instance: "bench", StartedAt: now,
			Spec: protocol.FunctionSpec{Version: protocol.Version, Name: fmt.Sprintf("tool_%04d", i), Team: "orders",
				Description: "Looks up an order by its id and returns its state, lines and totals.",
				Parameters:  json.RawMessage(`{"type":"object","properties":{"order_id":{"type":"string","description":"The order's id."},"verbose":{"type":"boolean"}},"required":["order_id"],"additionalProperties":false}`), UpdatedAt: now}}
	}
	nc, _ := e.srv.Connect(b)
	keeper, err := lease.Declare(b.Context(), nc, "orders", decls, testutil.Logger(b))
	if err != nil {
		b.Fatal(err)
	}
	testutil.WaitForWhat(b, time.Minute, "the declarations served", func() bool {
		return len(d.ServedFunctions(func(string) bool { return true })) == n
	})
	cpu0, in0 := processCPU(), serverIn(b, e)
	for b.Loop() {
		if err := keeper.Renew(b.Context()); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N*n), "µs/declaration")
	b.ReportMetric(float64((processCPU()-cpu0).Microseconds())/float64(b.N*n), "cpu-µs/declaration")
	in1 := serverIn(b, e)
	b.ReportMetric(float64(in1[0]-in0[0])/float64(b.N*n), "server-msgs-in/declaration")
	b.ReportMetric(float64(in1[1]-in0[1])/float64(b.N*n), "server-bytes-in/declaration")
}

// serverIn is the messages and bytes the server has received.
func serverIn(b *testing.B, e *env) [2]int64 {
	v, err := e.srv.Varz(nil)
	if err != nil {
		b.Fatal(err)
	}
	return [2]int64{v.InMsgs, v.InBytes}
}

// processCPU is the CPU time this process (the server's included) has
// used.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
