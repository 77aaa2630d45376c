package dispatch

import (
	"errors"
	"net/http"
	"testing"

	"github.com/toolrelay/toolrelay/internal/natstest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// A dispatcher with no watch driver attached drives no watches, and says
// so: Watch returns ErrNoWatchDriver, the watch API answers 501, and a
// response.completed webhook finds no watch of its response.
func TestWithoutAWatchDriverNothingIsWatched(t *testing.T) {
	t.Parallel()
	_, js := natstest.Start(t).Connect(t)
	d := replica(t, js, "one")
	ref := Ref{Platform: protocol.PlatformResponses, ResponseID: "resp_unwatched"}
	if _, err := d.Watch(t.Context(), ref); !errors.Is(err, ErrNoWatchDriver) {
		t.Fatalf("Watch without a driver: %v; want ErrNoWatchDriver", err)
	}
	if status, reply := d.AnswerWatchRequest(t.Context(), []byte(`{"platform":"responses","response_id":"resp_unwatched"}`)); status != http.StatusNotImplemented {
		t.Fatalf("watch request without a driver: %d %v; want 501", status, reply)
	}
	if outcome, err := d.takeInEvent(t.Context(), "response.completed", ref.ResponseID); err != nil || outcome != "ignored" {
		t.Fatalf("response.completed without a driver: %q, %v; want ignored", outcome, err)
	}
}
