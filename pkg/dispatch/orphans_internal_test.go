package dispatch

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The orphan scan asks the registry about each function the open turns
// call, and walks the open calls only when one of those has no executor:
// at 100,000 open turns of served functions, walking every call every
// scan was a sixth of the dispatcher's CPU. The functions are counted as
// turns are tracked and forgotten; a rejected call (a name nobody
// serves, which any caller can send) is not one of them.
func TestTheOrphanScanWalksNoCallWhileItsFunctionsAreServed(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, _, _ := provisioned(t, Options{Name: "one", Logger: testutil.Logger(t), ServeGrace: time.Hour})
	d.spawn = func(func(context.Context)) {}
	d.registry.loaded.Store(true)
	serve := func(name string, on bool) {
		d.registry.mu.Lock()
		defer d.registry.mu.Unlock()
		if !on {
			delete(d.registry.live, name)
			return
		}
		d.registry.live[name] = map[string]*declared{"x": {
			decl:    &protocol.Declaration{Spec: protocol.FunctionSpec{Name: name, Team: "geo"}},
			expires: time.Now().Add(time.Hour)}}
	}
	serve("get_weather", true)
	serve("get_city", true)
	var keys []protocol.TurnKey
	for i := range 100 {
		key := protocol.NewTurnKey(protocol.PlatformResponses, fmt.Sprintf("resp_%d", i), []string{"call_1", "call_2", "call_3"})
		keys = append(keys, key)
		d.gather.track(&Turn{Key: key, State: TurnCollecting, CreatedAt: time.Now(), Deadline: time.Now().Add(time.Hour), Calls: []TurnCall{
			{ID: "call_1", Name: "get_weather", Team: "geo", Key: key.Call("call_1")},
			{ID: "call_2", Name: "get_city", Team: "geo", Key: key.Call("call_2")},
			{ID: "call_3", Name: "no_such_tool", Key: key.Call("call_3"), Rejected: true},
		}}, 1)
	}
	o := &orphans{unserved: map[fnKey]time.Time{}, failed: map[protocol.CallKey]bool{}}
	d.failOrphans(ctx, o, time.Now())
	if o.walks != 0 || len(o.unserved) != 0 {
		t.Fatalf("with every function served the scan walked the open calls %d times (unserved: %v)", o.walks, o.unserved)
	}

	serve("get_city", false) // its last executor went
	d.failOrphans(ctx, o, time.Now())
	if o.walks != 1 || len(o.unserved) != 1 || o.unserved[fnKey{"geo", "get_city"}].IsZero() {
		t.Fatalf("with get_city unserved: %d walks, unserved %v; want one walk, get_city unserved", o.walks, o.unserved)
	}

	for _, key := range keys { // the turns close: no open call asks for get_city
		d.gather.forget(key)
	}
	d.failOrphans(ctx, o, time.Now())
	if o.walks != 1 || len(o.unserved) != 0 || len(d.gather.functions()) != 0 {
		t.Fatalf("with no open turn: %d walks (want still 1), unserved %v, functions counted %v", o.walks, o.unserved, d.gather.functions())
	}
}
