package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Agents sessions: the event stream (server-sent events).

// subscribe registers a live subscriber. Caller holds s.mu.
func (s *Server) subscribe(sess *session) chan []byte {
	ch := make(chan []byte, 1024)
	sess.subs[ch] = struct{}{}
	return ch
}

// emit sends a frame to the session's live subscribers; a subscriber too
// slow to keep 1024 frames is dropped (its stream ends). Caller holds s.mu.
func (s *Server) emit(sess *session, frame map[string]any) {
	sess.eventSeq++
	frame["event_id"] = fmt.Sprintf("evt_%s_%06d", sess.id[3:11], sess.eventSeq)
	b, err := json.Marshal(frame)
	if err != nil {
		s.log.Error("encode frame", "err", err)
		return
	}
	for ch := range sess.subs {
		select {
		case ch <- b:
		default:
			delete(sess.subs, ch)
			close(ch)
		}
	}
}

func (s *Server) unsubscribe(sess *session, ch chan []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := sess.subs[ch]; ok {
		delete(sess.subs, ch)
		close(ch)
	}
}

func (s *Server) streamSessionEvents(w http.ResponseWriter, r *http.Request) {
	sess := s.lookupSession(w, r)
	if sess == nil {
		return
	}
	s.mu.Lock()
	sub := s.subscribe(sess)
	s.mu.Unlock()
	s.serveFrames(w, r, sess, sub, false)
}

// serveFrames writes live frames as SSE until the client leaves or the
// server closes. With untilIdle it also ends after the session goes idle
// once a turn ended (the creation stream).
func (s *Server) serveFrames(w http.ResponseWriter, r *http.Request, sess *session, sub chan []byte, untilIdle bool) {
	defer s.unsubscribe(sess, sub)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	if flusher != nil {
		flusher.Flush()
	}
	keepalive := time.NewTicker(15 * time.Second)
	defer keepalive.Stop()
	turnEnded := false
	for {
		select {
		case b, ok := <-sub:
			if !ok {
				return
			}
			if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
			if untilIdle {
				var f struct{ Type string }
				_ = json.Unmarshal(b, &f)
				switch {
				case strings.HasPrefix(f.Type, "agent.session.turn.") && (strings.HasSuffix(f.Type, ".completed") || strings.HasSuffix(f.Type, ".failed") || strings.HasSuffix(f.Type, ".cancelled")):
					turnEnded = true
				case f.Type == "agent.session.idle" && turnEnded, f.Type == "agent.session.failed":
					return
				}
			}
		case <-keepalive.C:
			if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
				return
			}
			if flusher != nil {
				flusher.Flush()
			}
		case <-r.Context().Done():
			return
		case <-s.closed:
			return
		}
	}
}
