package leaderread_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolrelay/toolrelay/internal/leaderread"
	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/internal/testutil"
)

// directGets returns a count of the direct gets (which any replica of a
// stream answers, the leader or not) sent to srv by connections whose
// inboxes start with inbox, as far as the spy has seen them.
func directGets(t *testing.T, srv *natstest.Server, inbox string) func() int64 {
	t.Helper()
	spy, _ := srv.Connect(t)
	var n atomic.Int64
	if _, err := spy.Subscribe("$JS.API.DIRECT.GET.>", func(m *nats.Msg) {
		if strings.HasPrefix(m.Reply, inbox+".") {
			n.Add(1)
		}
	}); err != nil {
		t.Fatal(err)
	}
	return func() int64 {
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		return n.Load()
	}
}

// Every state a key can be in reads back as jetstream's own Get reads it
// (value, revision, creation time, or the same error), and none of the
// reads is a direct get.
func TestGetAnswersAsJetStreamDoes(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx := context.Background()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", History: 2, LimitMarkerTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	steps := []struct {
		name string
		do   func() error
	}{
		{"put", func() error { _, err := kv.Put(ctx, "a.b", []byte("one")); return err }},
		{"updated", func() error { _, err := kv.Put(ctx, "a.b", []byte("two")); return err }},
		{"another key put", func() error { _, err := kv.Put(ctx, "c", []byte("three")); return err }},
		{"deleted", func() error { return kv.Delete(ctx, "c") }},
		{"purged", func() error { return kv.Purge(ctx, "a.b") }},
		{"put again", func() error { _, err := kv.Put(ctx, "a.b", []byte("four")); return err }},
		{"created with a TTL", func() error {
			_, err := kv.Create(ctx, "ttl", []byte("five"), jetstream.KeyTTL(time.Second))
			return err
		}},
	}
	// The reads under test go out on a connection of their own, so the
	// spy tells them from jetstream's.
	const inbox = "_LEADER_READS"
	direct := directGets(t, srv, inbox)
	_, ljs := natstest.Connect(t, srv.ClientURL(), nats.CustomInboxPrefix(inbox))
	lkv, err := ljs.KeyValue(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	leader := leaderread.KV(ljs, lkv)
	check := func(step string) {
		t.Helper()
		for _, key := range []string{"a.b", "c", "ttl", "never", "bad..key", ".bad", ""} {
			got, gotErr := leader.Get(ctx, key)
			if n := direct(); n != 0 {
				t.Fatalf("%s: Get(%q): %d direct gets so far", step, key, n)
			}
			want, wantErr := kv.Get(ctx, key)
			if !errors.Is(gotErr, wantErr) && (gotErr == nil || wantErr == nil || gotErr.Error() != wantErr.Error()) {
				t.Errorf("%s: Get(%q) error %v, jetstream %v", step, key, gotErr, wantErr)
				continue
			}
			if want == nil {
				continue
			}
			if string(got.Value()) != string(want.Value()) || got.Revision() != want.Revision() || !got.Created().Equal(want.Created()) ||
				got.Key() != want.Key() || got.Bucket() != want.Bucket() || got.Operation() != want.Operation() {
				t.Errorf("%s: Get(%q) = %q rev %d at %v, jetstream %q rev %d at %v", step, key,
					got.Value(), got.Revision(), got.Created(), want.Value(), want.Revision(), want.Created())
			}
		}
	}
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.name, err)
		}
		check(s.name)
	}
	// The TTL runs out: the server leaves a marker on the key.
	testutil.WaitForWhat(t, 10*time.Second, "the key's TTL to run out", func() bool {
		_, err := kv.Get(ctx, "ttl")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	check("expired")
}

// A stream without a leader (here: none at all) is an error, not "not
// found": a caller must not take it for an absent key.
func TestLastForWithoutAStreamIsAnError(t *testing.T) {
	srv := natstest.Start(t)
	_, js := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := leaderread.LastFor(ctx, js, "MISSING", "x")
	if err == nil || errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Fatalf("LastFor on a missing stream = %v, want an error other than not found", err)
	}
}

// A context with an API prefix or a domain sends its reads there.
func TestLastForUsesTheContextsPrefix(t *testing.T) {
	srv := natstest.Start(t)
	nc, js := srv.Connect(t)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "s.x", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	spy, _ := srv.Connect(t)
	var seen atomic.Value
	if _, err := spy.Subscribe("$JS.elsewhere.API.STREAM.MSG.GET.S", func(m *nats.Msg) {
		seen.Store(m.Subject)
		_ = m.Respond([]byte(`{"error":{"code":404,"err_code":10037,"description":"no message found"}}`))
	}); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, make := range []func() (jetstream.JetStream, error){
		func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(nc, "$JS.elsewhere.API") },
		func() (jetstream.JetStream, error) { return jetstream.NewWithDomain(nc, "elsewhere") },
	} {
		seen.Store("")
		pjs, err := make()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaderread.LastFor(ctx, pjs, "S", "s.x"); !errors.Is(err, jetstream.ErrMsgNotFound) || seen.Load() == "" {
			t.Errorf("LastFor through %+v: %v, request seen %q", pjs.Options(), err, seen.Load())
		}
	}
	m, err := leaderread.LastFor(ctx, js, "S", "s.x")
	if err != nil || string(m.Data) != "hello" || m.Sequence != 1 {
		t.Fatalf("LastFor = %+v, %v", m, err)
	}
}
