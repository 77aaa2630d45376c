package dispatch_test

import (
	"flag"
	"testing"

	"go.uber.org/goleak"
)

// parallel is how many tests run at once unless -test.parallel says: the
// tests spend their time waiting on JetStream, the platform simulator and
// timers, not on a core, so the default of GOMAXPROCS (2 on a small CI
// machine) would leave them running nearly one after another.
const parallel = "8"

func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", parallel)
	}
	goleak.VerifyTestMain(m,
		// nats-server and the HTTP test servers keep process-wide goroutines.
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).Start"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"),
		goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
	)
}
