package dispatch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/metric"

	"github.com/toolrelay/toolrelay/internal/provision"
	"github.com/toolrelay/toolrelay/pkg/dispatch/internal/lifecycle"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The sweep repairs what a dead replica left behind. Every replica runs it;
// everything it does is idempotent or compare-and-set, so sweeping twice is
// harmless.
//
//   - a turn collecting past its deadline (its timer was never armed) is
//     cut off and submitted;
//   - a turn collecting whose results are all recorded (the replica that
//     saw the last one died before closing it) is closed;
//   - a turn collecting for a while is re-armed: its timer and its calls
//     re-published (deduplicated, within their window), in case intake
//     died half-way;
//   - a turn left submitting by a replica whose lease lapsed is taken
//     over and submitted again;
//   - the attached WatchDriver drives again the watches whose driver
//     stopped (WatchDriver.Sweep);
//   - timers of closed turns are purged.
//
// Open turns are found through their timers: a turn's timer subjects
// (scheduled, then fired) exist from intake until it is submitted or
// failed.
const (
	// sweepAfter is how old an open turn must be before the sweep touches
	// it: a healthy turn is closed by its owner long before. It is the
	// lease taken at intake, after which another replica may take it.
	sweepAfter = lifecycle.LeaseFor
	// timerGrace is how long past its deadline a collecting turn may stay
	// before the sweep cuts it off itself: its timer fires on the whole
	// second before the deadline and closes it at once.
	timerGrace = 2 * time.Second
	// markersLast is how long after a turn's close the sweep may still
	// see the markers that removed its timer (they expire after a second).
	markersLast = 30 * time.Second
)

func (d *Dispatcher) sweep(ctx context.Context, startup bool) {
	now := time.Now()
	defer func() {
		d.tel.sweepDuration.Record(context.WithoutCancel(ctx), time.Since(now).Seconds(),
			metric.WithAttributes(attrStartup.Bool(startup)))
	}()
	// A turn this replica gathers for is swept as it is listed, from the
	// record it holds: its record is read only once that shows it past its
	// deadline or no longer collecting (lifecycle.SweepReads), and its
	// engine looks at it again on its re-checks. Under load most open turns
	// are tracked here, and reading each one's record every pass was most
	// of the sweep's cost. Ages and the time since the last sweep are both
	// measured from the sweep's start, so that the sweeps' windows tile
	// time and no turn misses its re-check, however long a listing takes.
	sinceLast := now.Sub(d.lastSweep) // the sweeps run one after another
	d.lastSweep = now
	keys, listed, err := d.openTurns(ctx, func(t *Turn) bool {
		age := now.Sub(t.CreatedAt)
		switch {
		case startup:
			return false
		case lifecycle.SweepReads(t.State, t.Deadline, now):
			if age > sweepAfter {
				return false
			}
			d.sweepYoung(t, now)
		case age > sweepAfter && lifecycle.RecheckDue(age, sinceLast):
			// Its results may be split with a replica that died before
			// closing it: the engine looks at the stream.
			d.gather.recheckSoon(t.Key)
		}
		return true
	})
	if err != nil && ctx.Err() == nil { // not the replica stopping
		d.log.Warn("sweep: listing open turns failed", "err", err)
	}
	listedAt := time.Now()
	var known *recordedResults // at start, the results of the open turns, from one listing
	work := 1
	if startup && err == nil {
		// A restart re-arms every open turn: their results are listed
		// once, and the turns re-armed a few at a time, each a handful of
		// round trips (its record, its timer, its calls).
		var lerr error
		if known, lerr = d.gather.recordedOf(ctx, listed); lerr != nil && ctx.Err() == nil {
			d.log.Warn("sweep: listing the open turns' results failed; asking the streams turn by turn", "err", lerr)
		}
		work = startupWorkers
	}
	sem := make(chan struct{}, work)
	var wg sync.WaitGroup
	for _, key := range keys {
		if ctx.Err() != nil {
			break
		}
		if d.recent.has(key, listedAt) {
			continue // closed here a moment ago: what was listed is its markers
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			d.sweepTurn(ctx, key, startup, known)
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	if known != nil {
		d.recheckCompletedSince(ctx, listed, known)
	}
	if err == nil {
		d.sweepUnlisted(ctx, listed, now)
	}
	if w := d.driver(); w != nil {
		w.Sweep(ctx, startup)
	}
}

// sweepYoung sweeps a turn this replica gathers for and took in less than
// sweepAfter ago, past its deadline or no longer collecting, as it knows
// it: nothing about it can be stuck yet (a replica submitting it has been
// for less than sweepAfter), so its record is not read.
func (d *Dispatcher) sweepYoung(t *Turn, now time.Time) {
	if now.After(t.Deadline.Add(timerGrace)) { // a deadline shorter than sweepAfter
		d.cutOffLate(t.Key, "sweep: turn past its deadline; cutting it off")
	}
}

// sweepUnlisted deals with the turns this replica gathers for that are
// missing from the index of open turns: one closed by another replica
// (which removed its timer) while this one waited for results it will
// never see is forgotten, and one still open whose timer was lost is cut
// off at its deadline, as its timer would have.
func (d *Dispatcher) sweepUnlisted(ctx context.Context, listed map[protocol.TurnKey]bool, now time.Time) {
	for _, t := range d.gather.trackedTurns() {
		if now.Sub(t.CreatedAt) <= sweepAfter || listed[t.Key] || ctx.Err() != nil {
			continue // too young to be missing from the listing for long (and not in listed), or open
		}
		key := t.Key
		r, _, err := d.turns.get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || (err == nil && !r.Open()):
			d.closedElsewhere(key)
		case err == nil && r.State == TurnCollecting && now.After(r.Deadline.Add(timerGrace)):
			d.cutOffLate(key, "sweep: turn without a timer past its deadline; cutting it off")
		}
	}
}

// openTurns lists the turns whose timer subjects exist: the open turns,
// each once, in the order listed and as a set. A turn this replica
// gathers for is named by the key it already holds, and handed first to
// seen (if not nil), which may take it out of the list (not the set) by
// returning true. A turn listed twice (both timer subjects, or pages that
// overlap) is handed to seen once. A sweep of many open turns must not cost the dispatcher much
// memory while it runs, so the listing (a stream-info request, in pages
// of up to the server's limit) is read from each page's bytes, not
// decoded into a map.
func (d *Dispatcher) openTurns(ctx context.Context, seen func(*Turn) bool) ([]protocol.TurnKey, map[protocol.TurnKey]bool, error) {
	var keys []protocol.TurnKey
	listed := map[protocol.TurnKey]bool{}
	add := func(subject string) {
		key, err := parseTimerSubject(subject)
		if err != nil || listed[key] {
			return
		}
		if t, _ := d.gather.cached(key); t != nil {
			listed[t.Key] = true
			if seen == nil || !seen(t) {
				keys = append(keys, t.Key)
			}
			return
		}
		key = protocol.TurnKey(strings.Clone(string(key))) // not the subject: the page goes
		listed[key] = true
		keys = append(keys, key)
	}
	// Scheduled timers first, then fired ones: a timer that fires while the
	// listing is read moves from the first to the second, and is listed.
	for _, filter := range []string{provision.TimerSubjectPrefix + ".sched.>", provision.TimerSubjectPrefix + ".fire.>"} {
		if err := d.listSubjects(ctx, provision.TimerStream, filter, add); err != nil {
			return keys, listed, fmt.Errorf("dispatch: list open turns: %w", err)
		}
	}
	return keys, listed, nil
}

// listSubjects hands each subject of stream that matches filter to each,
// reading the stream-info answer page by page. Each page has its own
// deadline: a request that finds no stream leader (one is being elected)
// gets no answer at all.
func (d *Dispatcher) listSubjects(ctx context.Context, stream, filter string, each func(string)) error {
	subject := "$JS.API.STREAM.INFO." + stream // New refuses other API prefixes
	return pageThrough(func(offset int) (int, []byte, error) {
		req := fmt.Appendf(nil, `{"subjects_filter":%q,"offset":%d}`, filter, offset)
		rctx, cancel := context.WithTimeout(ctx, listPageTimeout)
		defer cancel()
		m, err := d.js.Conn().RequestWithContext(rctx, subject, req)
		if err != nil {
			return 0, nil, err
		}
		return decodeSubjectsPage(m.Data)
	}, each)
}

// pageThrough reads every page fetch returns. The server cuts its sorted
// list of subjects into pages by position, and the list changes between
// requests: subjects deleted before the position shift the rest back, and
// a plain next offset would skip as many. So each page is asked to overlap
// the last, and one that starts past everything read so far (more was
// deleted than it overlapped) is asked for again from further back.
// Subjects may so be handed to each more than once.
func pageThrough(fetch func(offset int) (total int, subjects []byte, err error), each func(string)) error {
	offset, back := 0, 0
	var last string // the greatest subject read
	for range maxPages {
		total, subjects, err := fetch(offset)
		if err != nil {
			return err
		}
		var first, greatest string
		n, err := eachSubject(subjects, func(s string) {
			if first == "" || s < first {
				first = s
			}
			greatest = max(greatest, s)
			each(s)
		})
		if err != nil {
			return err
		}
		if offset > 0 && n > 0 && first > last {
			// Subjects between the last page and this one may be unread.
			back = max(2*back, 2*pageOverlap(n))
			offset = max(offset-back, 0)
			continue
		}
		back, last = 0, max(last, greatest)
		switch {
		case offset+n >= total:
			return nil
		case n == 0:
			return fmt.Errorf("the listing ended at %d of %d subjects", offset, total)
		}
		offset += n - pageOverlap(n)
	}
	return fmt.Errorf("the listing did not settle in %d pages", maxPages)
}

// pageOverlap is how many subjects of a page of n the next page repeats.
func pageOverlap(n int) int {
	if n < 2 {
		return 0
	}
	return max(1, min(n/10, 1000))
}

// maxPages bounds one listing: at the server's 100k subjects a page, ten
// million open turns.
const maxPages = 100

// listPageTimeout bounds the request for one page of the listing of open
// turns.
const listPageTimeout = 10 * time.Second

// decodeSubjectsPage reads one page of a stream-info answer with subject
// details: the total the server has, and this page's subjects as they
// came (see eachSubject), a slice of data rather than a copy: at 100k open
// turns a page is several megabytes.
func decodeSubjectsPage(data []byte) (total int, subjects []byte, err error) {
	var page struct {
		Error *jetstream.APIError `json:"error"`
		Total int                 `json:"total"`
		State *struct {
			Subjects rawSlice `json:"subjects"`
		} `json:"state"`
	}
	if err := json.Unmarshal(data, &page); err != nil {
		return 0, nil, fmt.Errorf("malformed stream info: %w", err)
	}
	if page.Error != nil {
		return 0, nil, page.Error
	}
	if page.State == nil {
		return 0, nil, errors.New("malformed stream info: no state")
	}
	return page.Total, page.State.Subjects, nil
}

// rawSlice is a JSON value kept as the slice of the input it came from.
// encoding/json's Unmarshal hands an Unmarshaler a slice of the data it
// was given (json.RawMessage copies it); the caller owns that data, so
// the slice stays valid as long as it does.
type rawSlice []byte

func (r *rawSlice) UnmarshalJSON(b []byte) error {
	*r = b
	return nil
}

// eachSubject calls each with every key of raw, a JSON object of subjects
// and message counts (or null), and returns how many there were. It reads
// them from raw's bytes: at 100k open turns, decoding them into a map was
// most of what a sweep allocated. Subjects
// hold no character JSON must escape, so the keys are read as they are;
// an object with an escape anywhere (or bytes that are not UTF-8, which
// encoding/json would replace) is decoded by encoding/json.
func eachSubject(raw []byte, each func(string)) (int, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return 0, nil
	}
	if bytes.IndexByte(raw, '\\') >= 0 || !utf8.Valid(raw) {
		var m map[string]json.Number
		if err := json.Unmarshal(raw, &m); err != nil {
			return 0, fmt.Errorf("malformed stream info: %w", err)
		}
		for s := range m {
			each(s)
		}
		return len(m), nil
	}
	// Valid JSON (Unmarshal checked it) without escapes: an object whose
	// members are "subject":count, separated by commas, with whitespace
	// maybe around each token.
	if raw[0] != '{' {
		return 0, fmt.Errorf("subjects: want an object, got %.20s", raw)
	}
	n := 0
	for i := 1; ; {
		i = skipSpace(raw, i)
		if i < len(raw) && raw[i] == '}' {
			return n, nil
		}
		if n > 0 {
			if i >= len(raw) || raw[i] != ',' {
				return 0, errors.New("subjects: malformed object")
			}
			i = skipSpace(raw, i+1)
		}
		if i >= len(raw) || raw[i] != '"' {
			return 0, errors.New("subjects: malformed object")
		}
		end := bytes.IndexByte(raw[i+1:], '"')
		if end < 0 {
			return 0, errors.New("subjects: malformed object")
		}
		end += i + 1
		subject := string(raw[i+1 : end])
		i = skipSpace(raw, end+1)
		if i >= len(raw) || raw[i] != ':' {
			return 0, errors.New("subjects: malformed object")
		}
		i = skipSpace(raw, i+1)
		digits := i
		for i < len(raw) && raw[i] >= '0' && raw[i] <= '9' {
			i++ // the count
		}
		if i == digits {
			return 0, fmt.Errorf("subjects: the count of %q is not a number", subject)
		}
		each(subject)
		n++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// startupWorkers bounds the turns the startup sweep re-arms at once.
const startupWorkers = 16

// sweepTurn reads the record of a turn the listing found: one this
// replica does not gather for, or one its copy shows past its deadline or
// no longer collecting (see sweep).
// known, at start, holds the open turns' recorded results.
func (d *Dispatcher) sweepTurn(ctx context.Context, key protocol.TurnKey, startup bool, known *recordedResults) {
	t, rev, err := d.turns.get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		// A timer without a record: intake died in between (or is under
		// way right now, so only old timers are dropped). A timer that
		// cannot be read is left for the next sweep.
		m, gerr := d.timers.GetLastMsgForSubject(ctx, timerScheduleSubject(key))
		if errors.Is(gerr, jetstream.ErrMsgNotFound) || gerr == nil && time.Since(m.Time) > sweepAfter {
			d.unindex(key, true)
		}
		return
	}
	if err != nil {
		return
	}
	if !t.Open() {
		if at := t.Outcome().SubmittedAt; !at.IsZero() && time.Since(at) < markersLast {
			// Closed a moment ago: what the sweep saw is the roll-up
			// markers its close left, not a timer. Marking it again
			// would keep the markers and fire the timers' consumer.
			d.gather.forget(key)
			return
		}
		d.finished(t, true)
		return
	}
	now := time.Now()
	age := now.Sub(t.CreatedAt)
	switch t.State {
	case TurnCollecting:
		switch {
		case now.After(t.Deadline.Add(timerGrace)):
			d.cutOffLate(key, "sweep: turn past its deadline; cutting it off")
		case startup || age > sweepAfter:
			if !d.gather.tracking(key) || startup {
				d.log.Info("sweep: re-arming turn", "turn", key, "age", age.Round(time.Second))
				d.resumeTurn(ctx, t, rev, known)
			} else {
				// Tracked since the listing, or its copy was behind: its
				// results may be split with a replica that died before
				// closing it, so look at the stream.
				d.gather.recheckSoon(key)
			}
		}
	case TurnSubmitting:
		// Its owner died mid-submission, or stopped and released it: the
		// engine takes it over and submits it again.
		if t.lease.Free(now) {
			d.gather.track(t, rev)
			d.engine.Close(string(key))
		}
	}
}

// recheckCompletedSince looks again at the open turns a restart re-armed
// whose results the listing before (known) did not hold all of, and a
// listing now does: a result recorded between the two reached this replica
// before it gathered for the turn, and no other replica gathers for it.
func (d *Dispatcher) recheckCompletedSince(ctx context.Context, listed map[protocol.TurnKey]bool, known *recordedResults) {
	now, err := d.gather.recordedOf(ctx, listed)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("sweep: listing the open turns' results again failed; their re-checks find what completed", "err", err)
		}
		return
	}
	for _, t := range d.gather.trackedTurns() {
		if listed[t.Key] && now.holdsAll(t) && !known.holdsAll(t) {
			d.gather.recheckSoon(t.Key)
		}
	}
}
