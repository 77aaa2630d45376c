// Package platformsim is an in-process agent platform that speaks the wire
// formats of OpenAI Agents sessions, OpenAI/Azure Assistants runs and the
// Responses API (including the Microsoft Foundry and Azure endpoint forms),
// as the official openai-go SDK sends and expects them. A scripted [Model]
// decides which functions the "model" calls and how it answers.
//
// It exists so the demo and the tests exercise toolrelay against the real
// protocol; its own tests drive it with the unmodified SDK.
//
// Besides the standard library it may import only openai-go (a client of
// its own, to start runs as a user would); the engine never imports it,
// only the demo, the dispatcher's simulator command and tests do.
package platformsim

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Options configures a Server. The zero value serves any API key and plays
// no scenario.
type Options struct {
	// Model plays the scenarios. Default: one with no scenario.
	Model *Model
	// APIKey, when set, must arrive as "Authorization: Bearer <key>" or as
	// "Api-Key: <key>" (the Azure form); other requests get 401.
	APIKey string
	// RunTTL is how long after creation an Assistants run expires.
	// Default: 10m, as on the live platform.
	RunTTL time.Duration
	// ModelLatency is how long the model "thinks" before each step.
	// Default: 0.
	ModelLatency time.Duration
	// Logger receives request errors. Default: discard.
	Logger *slog.Logger
	// Webhook, when set, receives signed events: agent.session.action_required
	// when a session waits for tool results, response.completed when a
	// background response completes.
	Webhook *Webhook
}

// Server is the simulated platform. It is an http.Handler.
type Server struct {
	opts  Options
	model *Model
	mux   *http.ServeMux
	log   *slog.Logger

	mu         sync.Mutex
	sessions   map[string]*session
	assistants map[string]json.RawMessage
	threads    map[string]*thread
	runs       map[string]*run
	responses  map[string]*response
	// idemResponses maps Idempotency-Keys of POST /responses to the
	// response they created.
	idemResponses map[string]string
	conversations map[string]*conversation
	// idem remembers Idempotency-Keys: key → hash of the body first sent.
	idem      map[string][32]byte
	stats     Stats
	book      ledger
	delivered []WebhookEvent

	bg     sync.WaitGroup
	closed chan struct{}
	once   sync.Once
}

// Stats counts what the platform accepted, for tests that assert exactly-once
// submission.
type Stats struct {
	// ToolResults is the number of agent.session.input.tool_result events
	// accepted (replays of an Idempotency-Key not counted).
	ToolResults int
	// SubmitToolOutputs is the number of accepted submit_tool_outputs.
	SubmitToolOutputs int
	// FunctionCallOutputs is the number of function_call_output items
	// accepted in continuations.
	FunctionCallOutputs int
	// ResponseReplays counts POST /responses answered from an
	// Idempotency-Key seen before: continuations a platform that kept every
	// request would have made twice.
	ResponseReplays int
	// Rejected counts requests answered with a 4xx.
	Rejected int
}

// New returns a simulator. Call Close when done.
func New(opts Options) *Server {
	if opts.Model == nil {
		opts.Model = &Model{}
	}
	if opts.RunTTL <= 0 {
		opts.RunTTL = 10 * time.Minute
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		opts: opts, model: opts.Model, log: opts.Logger,
		sessions:      map[string]*session{},
		assistants:    map[string]json.RawMessage{},
		threads:       map[string]*thread{},
		runs:          map[string]*run{},
		responses:     map[string]*response{},
		idemResponses: map[string]string{},
		conversations: map[string]*conversation{},
		idem:          map[string][32]byte{},
		closed:        make(chan struct{}),
	}
	s.mux = http.NewServeMux()
	s.routeAgents()
	s.routeAssistants()
	s.routeResponses()
	return s
}

// Close ends every event stream and waits for the model's background work.
func (s *Server) Close() {
	s.once.Do(func() { close(s.closed) })
	s.bg.Wait()
}

// Stats returns what the platform has accepted so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// ServeHTTP serves the API under /v1/ (OpenAI), {project}/openai/v1/
// (Foundry) and {endpoint}/openai/ with ?api-version= (Azure OpenAI).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path, ok := apiPath(r)
	if !ok {
		s.writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", fmt.Sprintf("Invalid URL (%s %s)", r.Method, r.URL.Path), "")
		return
	}
	if !s.authorized(r) {
		s.writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "Incorrect API key provided.", "")
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path = path
	r2.URL.RawPath = ""
	s.mux.ServeHTTP(w, r2)
}

// apiPath maps the three URL forms onto one path such as "/responses".
func apiPath(r *http.Request) (string, bool) {
	p := r.URL.Path
	if i := strings.Index(p, "/openai/v1/"); i >= 0 {
		return p[i+len("/openai/v1"):], true
	}
	if rest, ok := strings.CutPrefix(p, "/v1/"); ok {
		return "/" + rest, true
	}
	if i := strings.Index(p, "/openai/"); i >= 0 && r.URL.Query().Get("api-version") != "" {
		return p[i+len("/openai"):], true
	}
	return "", false
}

func (s *Server) authorized(r *http.Request) bool {
	if s.opts.APIKey == "" {
		return true
	}
	if r.Header.Get("Authorization") == "Bearer "+s.opts.APIKey {
		return true
	}
	return r.Header.Get("Api-Key") == s.opts.APIKey
}

// writeError writes the platforms' error body. The SDK decodes its "error"
// object into openai.Error.
func (s *Server) writeError(w http.ResponseWriter, status int, typ, code, message, param string) {
	if status < 500 {
		s.mu.Lock()
		s.stats.Rejected++
		s.mu.Unlock()
	}
	body := map[string]any{"error": map[string]any{
		"message": message, "type": typ, "param": nullable(param), "code": nullable(code),
	}}
	writeJSON(w, status, body)
}

// apiError is an error answer decided under the lock and written after it.
type apiError struct {
	status                    int
	typ, code, message, param string
}

func invalid(message, param string) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "invalid_request_error", message: message, param: param}
}

func (s *Server) writeAPIError(w http.ResponseWriter, e *apiError) {
	s.writeError(w, e.status, e.typ, e.code, e.message, e.param)
}

func (s *Server) badRequest(w http.ResponseWriter, message, param string) {
	s.writeError(w, http.StatusBadRequest, "invalid_request_error", "", message, param)
}

func (s *Server) notFound(w http.ResponseWriter, what, id string) {
	s.writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", fmt.Sprintf("No %s found with id '%s'.", what, id), "")
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// maxBody bounds request bodies.
const maxBody = 8 << 20

// readBody reads and size-checks a request body; it writes the error itself.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		s.badRequest(w, "Could not read the request body: "+err.Error(), "")
		return nil, false
	}
	return b, true
}

// decode reads a JSON object body into v; it writes the error itself.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) ([]byte, bool) {
	b, ok := s.readBody(w, r)
	if !ok {
		return nil, false
	}
	if len(b) == 0 {
		b = []byte("{}")
	}
	if err := json.Unmarshal(b, v); err != nil {
		s.badRequest(w, "We could not parse the JSON body of your request: "+err.Error(), "")
		return nil, false
	}
	return b, true
}

// replayed checks an Idempotency-Key: it reports true when the same key
// came with the same body before (the caller answers as it did then), and
// writes a 400 when the key came with a different body.
func (s *Server) replayed(w http.ResponseWriter, r *http.Request, scope string, body []byte) (replay, conflict bool) {
	key := r.Header.Get("Idempotency-Key")
	if key == "" {
		return false, false
	}
	sum := sha256.Sum256(body)
	s.mu.Lock()
	prev, seen := s.idem[scope+"\x00"+key]
	if !seen {
		s.idem[scope+"\x00"+key] = sum
	}
	s.mu.Unlock()
	if !seen {
		return false, false
	}
	if prev != sum {
		s.writeError(w, http.StatusBadRequest, "invalid_request_error", "idempotency_key_reused",
			"This Idempotency-Key was already used with a different request body.", "")
		return false, true
	}
	return true, false
}

// forget releases an Idempotency-Key whose request was rejected, so a
// corrected retry with the same key is processed.
func (s *Server) forget(r *http.Request, scope string) {
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		s.mu.Lock()
		delete(s.idem, scope+"\x00"+key)
		s.mu.Unlock()
	}
}

// later runs f after the model's latency, off the request goroutine.
func (s *Server) later(f func()) {
	s.bg.Go(func() {
		if d := s.opts.ModelLatency; d > 0 {
			select {
			case <-time.After(d):
			case <-s.closed:
				return
			}
		}
		f()
	})
}

const idAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

func newID(prefix string) string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return prefix + string(b)
}

func unixNow() int64 { return time.Now().Unix() }

// paginate serves a CursorPage of items (held oldest first, each with an
// "id") honouring the order ("asc" or "desc", default desc), limit (1..100,
// default 20) and after query parameters.
func paginate(q url.Values, items []map[string]any) (map[string]any, error) {
	id := func(m map[string]any) string { return m["id"].(string) }
	data := slices.Clone(items)
	switch q.Get("order") {
	case "", "desc":
		slices.Reverse(data)
	case "asc":
	default:
		return nil, fmt.Errorf("Invalid value for 'order': must be 'asc' or 'desc'.")
	}
	limit := 20
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 100 {
			return nil, fmt.Errorf("Invalid value for 'limit': must be an integer between 1 and 100.")
		}
		limit = n
	}
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(data, func(m map[string]any) bool { return id(m) == after })
		if i < 0 {
			return nil, fmt.Errorf("Invalid value for 'after': no object with id '%s'.", after)
		}
		data = data[i+1:]
	}
	more := len(data) > limit
	if more {
		data = data[:limit]
	}
	var first, last any
	if len(data) > 0 {
		first, last = id(data[0]), id(data[len(data)-1])
	}
	if data == nil {
		data = []map[string]any{}
	}
	return map[string]any{"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": more}, nil
}

// writePage answers a list request with its page, or 400 when the paging
// parameters were bad.
func (s *Server) writePage(w http.ResponseWriter, page map[string]any, err error) {
	if err != nil {
		s.badRequest(w, err.Error(), "")
		return
	}
	writeJSON(w, http.StatusOK, page)
}
