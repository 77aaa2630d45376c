package dispatch_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/dispatch"
	"github.com/toolrelay/toolrelay/pkg/dispatch/httpapi"
)

// jsonrpcReply is a JSON-RPC response as a client decodes it.
type jsonrpcReply struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Error   *struct {
		Code    int64  `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// A request /mcp cannot take is answered with the JSON-RPC error the
// specification names, carrying the request's id, whatever protocol
// version the client speaks: -32601 for a method nobody serves, -32600 for
// a request without its params, -32700 for a body that is not JSON.
func TestMCPAnswersJSONRPCErrors(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	d, _ := e.dispatcher(dispatch.Options{})
	hs := httptest.NewServer(httpapi.New(d, httpapi.Options{Logger: testutil.Logger(t)}))
	t.Cleanup(hs.Close)

	cases := []struct {
		name, body string
		id         string
		code       int64
	}{
		{"unknown method", `{"jsonrpc":"2.0","id":7,"method":"tools/frobnicate","params":{}}`, "7", -32601},
		{"unknown method, string id", `{"jsonrpc":"2.0","id":"a-1","method":"sampling/whatever"}`, `"a-1"`, -32601},
		{"call without params", `{"jsonrpc":"2.0","id":8,"method":"tools/call"}`, "8", -32600},
		{"not JSON", `{"jsonrpc":"2.0","id":9,"method":`, "null", -32700},
	}
	for _, version := range []string{"", "2025-03-26", "2025-11-25"} {
		for _, c := range cases {
			header := http.Header{}
			if version != "" {
				header.Set("Mcp-Protocol-Version", version)
			}
			status, body := mcpPost(t, hs.URL+"/mcp", c.body, header)
			var reply jsonrpcReply
			if err := json.Unmarshal(body, &reply); err != nil || status != http.StatusBadRequest || reply.JSONRPC != "2.0" ||
				reply.Error == nil || reply.Error.Code != c.code || string(reply.ID) != c.id || reply.Error.Message == "" {
				t.Errorf("%s (version %q): %d %.300s; want 400 with JSON-RPC error %d and id %s (%v)", c.name, version, status, body, c.code, c.id, err)
			}
		}
	}

	// What the SDK answers well passes through untouched: a known method.
	status, body := mcpPost(t, hs.URL+"/mcp", `{"jsonrpc":"2.0","id":1,"method":"ping"}`, nil)
	if status != http.StatusOK || !strings.Contains(string(body), `"result"`) {
		t.Errorf("ping: %d %.300s", status, body)
	}
}
