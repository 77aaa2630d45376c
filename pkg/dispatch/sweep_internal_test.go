package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// openTurns reads the index of open turns page by page as it decodes it;
// it must find what the stream's own listing finds: each turn once,
// whether its timer is scheduled, fired or both, and nothing that is not
// a timer.
func TestOpenTurnsListsWhatTheStreamHolds(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	// Provisioned but not running: a running replica's sweep unindexes
	// these turns, which have no record, while they are listed (a fired
	// one at once), and the listing would come up short.
	d, err := New(js, []Platform{idlePlatform{}}, Options{Name: "one", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.provision(ctx); err != nil {
		t.Fatal(err)
	}

	want := map[protocol.TurnKey]bool{}
	for i := range 1500 {
		key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_"+strconv.Itoa(i), []string{"call_1"})
		want[key] = true
		subjects := []string{timerScheduleSubject(key)}
		switch i % 3 {
		case 1:
			subjects = []string{timerFireSubject(key)}
		case 2:
			subjects = append(subjects, timerFireSubject(key))
		}
		for _, s := range subjects {
			if _, err := js.Publish(ctx, s, []byte(key)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := js.Publish(ctx, provision.TimerSubjectPrefix+".other.x", nil); err != nil {
		t.Fatal(err)
	}

	keys, listed, err := d.openTurns(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != len(want) || len(listed) != len(want) {
		t.Fatalf("listed %d keys (%d in the set), want %d", len(keys), len(listed), len(want))
	}
	for _, k := range keys {
		if !want[k] || !listed[k] {
			t.Fatalf("listed %s, which is not an open turn (or not in the set)", k)
		}
	}

	// Turns this replica gathers for go to seen first, once each; those it
	// takes are left out of the keys (the sweep reads no record of them),
	// not out of the set (which tells the sweep they are open).
	taken := map[protocol.TurnKey]bool{}
	for i, k := range keys[:600] {
		d.gather.track(&Turn{Key: k, CreatedAt: time.Now()}, 1)
		if i%2 == 0 {
			taken[k] = true
		}
	}
	seen := map[protocol.TurnKey]int{}
	keys, listed, err = d.openTurns(ctx, func(tr *Turn) bool {
		seen[tr.Key]++
		return taken[tr.Key]
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(seen) != 600 || len(keys) != len(want)-len(taken) || len(listed) != len(want) {
		t.Fatalf("seen %d tracked turns (want 600), listed %d keys (want %d), %d in the set (want %d)", len(seen), len(keys), len(want)-len(taken), len(listed), len(want))
	}
	for k, n := range seen {
		if n != 1 || !listed[k] {
			t.Fatalf("turn %s handed to seen %d times (in the set: %v), want once, in the set", k, n, listed[k])
		}
	}
	for _, k := range keys {
		if taken[k] || !want[k] {
			t.Fatalf("listed %s, which seen took or is not open", k)
		}
	}
}

func TestDecodeSubjectsPage(t *testing.T) {
	total, subjects, err := decodeSubjectsPage([]byte(`{"type":"io.nats.jetstream.api.v1.stream_info_response","total":5,"offset":0,"limit":100000,
		"config":{"name":"FNTIMERS","subjects":["fntimer.>"]},"state":{"messages":3,"subjects":{"fntimer.sched.a":1, "fntimer.fire.b" : 2 },"num_subjects":2}}`))
	var got []string
	var n int
	if err == nil {
		n, err = eachSubject(subjects, func(s string) { got = append(got, s) })
	}
	if err != nil || total != 5 || n != 2 || len(got) != 2 || got[0] != "fntimer.sched.a" || got[1] != "fntimer.fire.b" {
		t.Fatalf("page: total %d, n %d, subjects %q, err %v; want 5, 2, the two subjects", total, n, got, err)
	}
	// An escape anywhere: decoded by encoding/json, to the same subjects.
	got = nil
	if n, err := eachSubject([]byte(`{"fntimer.sched.a":1,"fntimer.fire.\u0062":2}`), func(s string) { got = append(got, s) }); err != nil || n != 2 ||
		!slices.Contains(got, "fntimer.fire.b") {
		t.Fatalf("escaped subjects: %q, n %d, err %v", got, n, err)
	}
	for _, empty := range []string{``, `null`, `{}`, ` { } `} {
		if n, err := eachSubject([]byte(empty), func(string) { t.Errorf("%q has no subject", empty) }); err != nil || n != 0 {
			t.Errorf("eachSubject(%q): n %d, err %v", empty, n, err)
		}
	}
	// The subjects are the answer's own bytes, not a copy: a page of 100k
	// open turns is several megabytes.
	answer := []byte(`{"total":1,"state":{"subjects":{"fntimer.sched.a":1}}}`)
	if _, subjects, err := decodeSubjectsPage(answer); err != nil {
		t.Fatal(err)
	} else if answer[bytes.Index(answer, []byte(".a"))+1] = 'z'; string(subjects) != `{"fntimer.sched.z":1}` {
		t.Fatalf("subjects %s after the answer changed: a copy, not the answer's bytes", subjects)
	}
	if _, subjects, err := decodeSubjectsPage([]byte(`{"total":0,"state":{"messages":0}}`)); err != nil || subjects != nil {
		t.Fatalf("a page without subjects: %s, err %v", subjects, err)
	}
	_, _, err = decodeSubjectsPage([]byte(`{"error":{"code":404,"err_code":10059,"description":"stream not found"}}`))
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamNotFound {
		t.Fatalf("an error answer: %v, want the server's APIError", err)
	}
	for _, bad := range []string{``, `[]`, `{"state":{"subjects":{"a":1}`} {
		if _, _, err := decodeSubjectsPage([]byte(bad)); err == nil {
			t.Errorf("decodeSubjectsPage(%q) accepted it", bad)
		}
	}
	for _, bad := range []string{`null`, `{"type":"io.nats.jetstream.api.v1.stream_info_response"}`} {
		if _, _, err := decodeSubjectsPage([]byte(bad)); err == nil {
			t.Errorf("decodeSubjectsPage(%q) accepted an answer without a state", bad)
		}
	}
	for _, bad := range []string{`[1]`, `{"s":[1,2]}`, `{"s":{"x":1}}`, `{"s":"1"}`, `{"s":1.5}`} {
		if _, err := eachSubject([]byte(bad), func(string) {}); err == nil {
			t.Errorf("eachSubject(%q) accepted it", bad)
		}
	}
}

// FuzzEachSubject holds the byte reader to encoding/json: for any object of
// subjects and counts, the same subjects.
func FuzzEachSubject(f *testing.F) {
	f.Add([]byte(`{"fntimer.sched.a":1,"fntimer.fire.b":2}`))
	f.Add([]byte(` { "a" : 1 , "b":2}`))
	f.Add([]byte(`{"a\"b":1}`))
	f.Fuzz(func(t *testing.T, raw []byte) {
		if !json.Valid(raw) {
			return // eachSubject reads what decodeSubjectsPage decoded: JSON
		}
		got := map[string]int{}
		n, err := eachSubject(raw, func(s string) { got[s]++ }) // must not panic, whatever the JSON
		var want map[string]json.Number
		if json.Unmarshal(raw, &want) != nil || want == nil {
			if err == nil && n > 0 {
				t.Fatalf("eachSubject(%q) read %d subjects from what is not an object of counts", raw, n)
			}
			return
		}
		for _, c := range want {
			if strings.Trim(c.String(), "0123456789") != "" {
				return // a count the server never sends (negative, fractional): an error is right
			}
		}
		if err != nil {
			t.Fatalf("eachSubject(%q): %v", raw, err)
		}
		if len(got) != len(want) {
			t.Fatalf("eachSubject(%q) = %v, encoding/json %v", raw, got, want)
		}
		for s := range want {
			if got[s] == 0 {
				t.Fatalf("eachSubject(%q) missed %q (got %v)", raw, s, got)
			}
		}
	})
}

// BenchmarkOpenTurns lists 20k open turns as the sweep does, beside the
// stream's own listing (what openTurns did before it read pages as it
// decoded them): compare their B/op and ns/op.
func BenchmarkOpenTurns(b *testing.B) {
	_, js := natstest.Start(b).Connect(b)
	d, ctx := replica(b, js, "one"), b.Context()
	const open = 20000
	for i := range open {
		key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_"+strconv.Itoa(i), []string{"call_1"})
		if _, err := js.PublishAsync(timerScheduleSubject(key), []byte(key)); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	b.Run("paged", func(b *testing.B) {
		for b.Loop() {
			if keys := d.mustOpenTurns(b); len(keys) != open {
				b.Fatalf("%d keys, want %d", len(keys), open)
			}
		}
	})
	b.Run("sweep-young", func(b *testing.B) { // every turn taken in here a moment ago
		for _, k := range d.mustOpenTurns(b) {
			d.gather.track(&Turn{Key: k, CreatedAt: time.Now(), Deadline: time.Now().Add(time.Hour)}, 1)
		}
		defer func() {
			for _, t := range d.gather.trackedTurns() {
				d.gather.forget(t.Key)
			}
		}()
		for b.Loop() {
			d.sweep(ctx, false)
		}
	})
	b.Run("stream-info", func(b *testing.B) {
		for b.Loop() {
			info, err := d.timers.Info(ctx, jetstream.WithSubjectFilter(provision.TimerSubjectPrefix+".>"))
			if err != nil || len(info.State.Subjects) != open {
				b.Fatal(err)
			}
			listed := map[protocol.TurnKey]bool{}
			for subj := range info.State.Subjects {
				if key, err := parseTimerSubject(subj); err == nil && !listed[key] {
					listed[protocol.TurnKey(strings.Clone(string(key)))] = true
				}
			}
		}
	})
}

func (d *Dispatcher) mustOpenTurns(tb testing.TB) []protocol.TurnKey {
	keys, _, err := d.openTurns(tb.Context(), nil)
	if err != nil {
		tb.Fatal(err)
	}
	return keys
}

// The server cuts its sorted list of subjects into pages by position, and
// the list changes between pages. Subjects deleted before the position
// must not make the listing skip any that stay; a page that shifted past
// the overlap is asked for again.
func TestPageThroughSkipsNothingThatStays(t *testing.T) {
	const pageSize = 100
	var set []string
	for i := range 1000 {
		set = append(set, fmt.Sprintf("fntimer.sched.%04d", i))
	}
	stay := map[string]bool{}
	for i, s := range set {
		if i%3 != 0 { // every third is deleted while the listing runs
			stay[s] = true
		}
	}
	pages := 0
	fetch := func(offset int) (int, []byte, error) {
		pages++
		if pages > 1 { // between pages, delete up to 150 subjects from the front half
			kept := set[:0:0]
			deleted := 0
			for i, s := range set {
				if !stay[s] && deleted < 150 && i < len(set)/2 {
					deleted++
					continue
				}
				kept = append(kept, s)
			}
			set = kept
		}
		offset = min(offset, len(set))
		end := min(offset+pageSize, len(set))
		page := map[string]int{}
		for _, s := range set[offset:end] {
			page[s] = 1
		}
		b, _ := json.Marshal(page)
		return len(set), b, nil
	}
	got := map[string]bool{}
	if err := pageThrough(fetch, func(s string) { got[s] = true }); err != nil {
		t.Fatal(err)
	}
	for s := range stay {
		if !got[s] {
			t.Fatalf("%s stayed throughout and was not listed (%d pages)", s, pages)
		}
	}
}

// A young turn past its deadline listed twice (its timer both scheduled
// and fired) is cut off once: the listing hands it to the sweep once.
func TestAYoungTurnListedTwiceIsCutOffOnce(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, _, js := provisioned(t, Options{Name: "one", Logger: testutil.Logger(t)})
	spawned := 0
	d.spawn = func(func(context.Context)) { spawned++ } // counts the closes, runs none; the sweep runs here
	key := protocol.NewTurnKey(protocol.PlatformResponses, "resp_x", []string{"call_1"})
	for _, s := range []string{timerScheduleSubject(key), timerFireSubject(key)} {
		if _, err := js.Publish(ctx, s, []byte(key)); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	d.gather.track(&Turn{Key: key, CreatedAt: now.Add(-6 * time.Second), Deadline: now.Add(-3 * time.Second)}, 1)
	d.sweep(ctx, false)
	if spawned != 1 {
		t.Fatalf("cut off %d times, want once", spawned)
	}
}

// The sweep reads the record of a turn this replica gathers for only once
// its deadline has come (or its copy shows it no longer collecting), and
// has the engine look at it again when its re-check is due (at 15 s,
// 30 s, 1 min, 2 min, then every 2 min); it reads every turn no replica
// here tracks on every pass. At 100,000 open turns reading each one's
// record every pass was the sweep's cost.
func TestTheSweepReadsATrackedTurnOnlyWhenItsRecheckIsDue(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	d, srv, _ := provisioned(t, Options{Name: "one", Logger: testutil.Logger(t)})
	d.spawn = func(func(context.Context)) {} // the re-checks and closes the sweep asks for run nowhere
	now := time.Now()
	turn := func(id string, age, left time.Duration, tracked bool) protocol.TurnKey {
		tn, rev := openRecord(t, d, id, now.Add(-age), now.Add(left), "get_weather")
		if tracked {
			d.gather.track(tn, rev)
		}
		return tn.Key
	}
	quiet := turn("resp_quiet", 45*time.Second, 5*time.Minute, true) // re-checked at 30 s, next at 1 min
	due := turn("resp_due", 62*time.Second, 5*time.Minute, true)     // crossed 1 min since the last sweep
	late := turn("resp_late", 45*time.Second, -time.Second, true)    // past its deadline, not yet cut off
	other := turn("resp_other", 45*time.Second, 5*time.Minute, false)

	// The reads go out on the dispatcher's connection, each before the
	// sweep returns; a message it publishes after the sweep arrives after
	// them.
	counter, _ := srv.Connect(t)
	seen := make(chan *nats.Msg, 64)
	for _, subj := range []string{"$JS.API.DIRECT.GET.KV_" + provision.TurnBucket + ".>", "$JS.API.STREAM.MSG.GET.KV_" + provision.TurnBucket, "test.sweep.done"} {
		if _, err := counter.ChanSubscribe(subj, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := counter.Flush(); err != nil {
		t.Fatal(err)
	}
	d.lastSweep = now.Add(-10 * time.Second)
	d.sweep(ctx, false)
	if err := d.js.Conn().Publish("test.sweep.done", nil); err != nil {
		t.Fatal(err)
	}
	read := map[protocol.TurnKey]bool{}
	deadline := time.After(10 * time.Second)
	for done := false; !done; {
		select {
		case m := <-seen:
			if m.Subject == "test.sweep.done" {
				done = true
				break
			}
			for _, k := range []protocol.TurnKey{quiet, due, late, other} {
				if strings.Contains(m.Subject, string(k)) || bytes.Contains(m.Data, []byte(k)) {
					read[k] = true
				}
			}
		case <-deadline:
			t.Fatal("the sweep's reads never came through")
		}
	}
	for k, want := range map[protocol.TurnKey]bool{quiet: false, due: false, late: true, other: true} {
		if read[k] != want {
			t.Errorf("turn %s: record read %v, want %v", k, read[k], want)
		}
	}
	for k, want := range map[protocol.TurnKey]bool{quiet: false, due: true} {
		d.gather.mu.Lock()
		rechecked := d.gather.turns[k].recheck != nil
		d.gather.mu.Unlock()
		if rechecked != want {
			t.Errorf("turn %s: re-checked %v, want %v", k, rechecked, want)
		}
	}
}

// provisioned returns a dispatcher whose streams and buckets are made,
// not running: the test drives its sweep, scans and index itself.
func provisioned(t *testing.T, opts Options) (*Dispatcher, *natstest.Server, jetstream.JetStream) {
	t.Helper()
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	d, err := New(js, []Platform{idlePlatform{}}, opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.provision(t.Context()); err != nil {
		t.Fatal(err)
	}
	return d, srv, js
}

// openRecord writes the record of a turn collecting since created, due
// at deadline, with a call of team geo's function for each of fns, and
// arms its timer.
func openRecord(t *testing.T, d *Dispatcher, id string, created, deadline time.Time, fns ...string) (*Turn, uint64) {
	t.Helper()
	ids := make([]string, len(fns))
	for i := range fns {
		ids[i] = fmt.Sprintf("call_%d", i+1)
	}
	key := protocol.NewTurnKey(protocol.PlatformResponses, id, ids)
	tn := &Turn{Version: protocol.Version, Key: key, State: TurnCollecting, CreatedAt: created, Deadline: deadline, ExpiresAt: deadline.Add(time.Minute)}
	for i, fn := range fns {
		tn.Calls = append(tn.Calls, TurnCall{ID: ids[i], Name: fn, Team: "geo", Key: key.Call(ids[i])})
	}
	rev, err := d.turns.create(t.Context(), tn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.js.PublishMsgAsync(timerMsg(tn)); err != nil {
		t.Fatal(err)
	}
	return tn, rev
}
