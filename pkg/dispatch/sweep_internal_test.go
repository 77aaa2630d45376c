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

	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A turn this replica gathers for is re-checked when its age passes
// sweepAfter, 2×, 4×... that, then every recheckEvery: a few times in a
// turn's life, however often the sweep runs, and never twice for one mark.
func TestRecheckDueOnAgesThatDouble(t *testing.T) {
	const every = 3 * time.Second // about how often the sweep runs
	var due []time.Duration
	for age := time.Duration(0); age < 10*time.Minute; age += every {
		if recheckDue(age, every) {
			due = append(due, age)
		}
	}
	// One sweep just after each of 15 s, 30 s, 1 m, 2 m, then every 2 m.
	want := []time.Duration{15 * time.Second, 30 * time.Second, 60 * time.Second, 120 * time.Second, 240 * time.Second, 360 * time.Second, 480 * time.Second}
	if len(due) != len(want) {
		t.Fatalf("re-checked at %v, want once just after each of %v", due, want)
	}
	for i := range want {
		if due[i] < want[i] || due[i] >= want[i]+every {
			t.Errorf("re-check %d at age %s, want within one sweep after %s", i, due[i], want[i])
		}
	}
	// The first sweep after a restart of the loop (sinceLast unknown, so
	// large) re-checks every turn past sweepAfter once.
	if !recheckDue(7*time.Minute, time.Hour) || recheckDue(10*time.Second, time.Hour) {
		t.Error("a first sweep should re-check the turns older than sweepAfter, and only those")
	}
}

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

	// Turns this replica gathers for go to seen first; those it takes are
	// left out of both the keys and the set (the sweep's young turns).
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
	if len(seen) != 600 || len(keys) != len(want)-len(taken) || len(listed) != len(keys) {
		t.Fatalf("seen %d tracked turns (want 600), listed %d keys (%d in the set), want %d", len(seen), len(keys), len(listed), len(want)-len(taken))
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
// and fired) is cut off once: the young turns are kept out of the set that
// would have told the second listing apart.
func TestAYoungTurnListedTwiceIsCutOffOnce(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	ctx := t.Context()
	d, err := New(js, []Platform{idlePlatform{}}, Options{Name: "one", Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if err := d.provision(ctx); err != nil {
		t.Fatal(err)
	}
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
