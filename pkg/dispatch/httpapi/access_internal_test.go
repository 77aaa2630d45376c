package httpapi

import "testing"

func TestGuardedPaths(t *testing.T) {
	open, guardMetrics := &Handler{}, &Handler{opts: Options{GuardMetrics: true}}
	for p, want := range map[string]bool{
		"/v1": true, "/v1/watch": true, "/v1/watch/w_1": true, "/v1/../v1/watch": true, "//v1/watch": true,
		"/mcp": true, "/mcp/": true, "/ui": true, "/ui/index.html": true,
		"/metrics": false, "/healthz": false, "/readyz": false, "/webhooks/openai": false,
		"/v1x": false, "/mcpx": false, "/v1/../healthz": false, "/": false,
	} {
		if got := open.guarded(p); got != want {
			t.Errorf("guarded(%q) = %v, want %v", p, got, want)
		}
		if got := guardMetrics.guarded(p); got != (want || p == "/metrics") {
			t.Errorf("with GuardMetrics, guarded(%q) = %v", p, got)
		}
	}
}

func TestBearerToken(t *testing.T) {
	for header, want := range map[string]string{
		"Bearer abc": "abc", "bearer abc": "abc", "BEARER  abc ": "abc",
		"": "", "Bearer": "", "Bearer ": "", "Basic YWJjOmRlZg==": "", "abc": "",
	} {
		got, ok := bearerToken(header)
		if got != want || ok != (want != "") {
			t.Errorf("bearerToken(%q) = %q, %v; want %q", header, got, ok, want)
		}
	}
}
