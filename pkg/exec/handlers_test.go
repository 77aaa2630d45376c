package exec_test

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/exec/exectest"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func command(t *testing.T, script string) exec.Function {
	t.Helper()
	h, err := exec.CommandHandler([]string{"sh", "-c", script})
	if err != nil {
		t.Fatal(err)
	}
	return exec.Function{Name: "cmd", Handler: h}
}

func TestCommandHandler(t *testing.T) {
	t.Run("stdin to stdout", func(t *testing.T) {
		res := exectest.Run(t, command(t, `read args; echo "got $args for $TOOLRELAY_FUNCTION/$TOOLRELAY_CALL_ID"`), `{"x":1}`, exectest.Options{})
		if !res.OK() || res.Output != "got {\"x\":1} for cmd/call_test\n" {
			t.Fatalf("result = %+v", res)
		}
	})
	t.Run("non-zero exit carries stderr", func(t *testing.T) {
		res := exectest.Run(t, command(t, `echo "order not found" >&2; exit 3`), `{}`, exectest.Options{})
		if res.OK() || !strings.Contains(res.Error.Message, "order not found") || !strings.Contains(res.Error.Message, "exit status 3") {
			t.Fatalf("result = %+v", res)
		}
	})
	t.Run("exit 75 is retryable", func(t *testing.T) {
		fn := command(t, `echo "busy" >&2; exit 75`)
		_, err := fn.Handler.Handle(t.Context(), &exec.Invocation{Call: exectest.Call(fn, `{}`, exectest.Options{})})
		if !errors.Is(err, exec.ErrRetryable) {
			t.Errorf("exit 75: %v is not retryable", err)
		}
	})
	t.Run("exit 65 is a refusal", func(t *testing.T) {
		fn := command(t, `echo "order A-1 has already shipped" >&2; exit 65`)
		_, err := fn.Handler.Handle(t.Context(), &exec.Invocation{Call: exectest.Call(fn, `{}`, exectest.Options{})})
		if !errors.Is(err, exec.ErrRefused) || errors.Is(err, exec.ErrRetryable) || !strings.Contains(err.Error(), "order A-1 has already shipped") {
			t.Errorf("exit 65: %v is not a refusal carrying stderr", err)
		}
	})
	t.Run("process group killed at the deadline", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		fn := command(t, `sleep 30 & echo $! > `+pidFile+`; wait`)
		res := exectest.Run(t, fn, `{}`, exectest.Options{Deadline: 300 * time.Millisecond})
		if res.OK() || res.Error.Code != protocol.CodeTimeout {
			t.Fatalf("result = %+v", res)
		}
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		testutil.WaitForWhat(t, 5*time.Second, "the command (pid "+strconv.Itoa(pid)+") to end", func() bool { return !alive(pid) })
	})
	t.Run("what it leaves in the background ends with the call", func(t *testing.T) {
		pidFile := filepath.Join(t.TempDir(), "pid")
		fn := command(t, `sleep 30 >/dev/null 2>&1 & echo $! > `+pidFile+`; echo done`)
		res := exectest.Run(t, fn, `{}`, exectest.Options{})
		if !res.OK() || res.Output != "done\n" {
			t.Fatalf("result = %+v", res)
		}
		b, err := os.ReadFile(pidFile)
		if err != nil {
			t.Fatal(err)
		}
		pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		testutil.WaitForWhat(t, 5*time.Second, "the background process (pid "+strconv.Itoa(pid)+") to end", func() bool { return !alive(pid) })
	})
	if _, err := exec.CommandHandler([]string{"no-such-binary-xyz"}); err == nil {
		t.Error("a missing binary was accepted")
	}
}

func TestHTTPHandler(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		switch {
		case strings.Contains(string(body), "slow"):
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		case strings.Contains(string(body), "fail"):
			http.Error(w, "eta service unavailable", http.StatusServiceUnavailable)
		default:
			w.Write([]byte(r.Header.Get("Idempotency-Key") + " " + r.Header.Get("Toolrelay-Function") + " " + string(body)))
		}
	}))
	defer srv.Close()
	h, err := exec.HTTPHandler(srv.URL, nil)
	if err != nil {
		t.Fatal(err)
	}
	fn := exec.Function{Name: "eta", Handler: h}
	call := exectest.Call(fn, `{"ok":1}`, exectest.Options{})
	if res := exectest.Run(t, fn, `{"ok":1}`, exectest.Options{}); !res.OK() || res.Output != string(call.Key)+` eta {"ok":1}` {
		t.Errorf("2xx: %+v", res)
	}
	if res := exectest.Run(t, fn, `{"fail":1}`, exectest.Options{}); res.OK() || !strings.Contains(res.Error.Message, "HTTP 503") || !strings.Contains(res.Error.Message, "eta service unavailable") {
		t.Errorf("503: %+v", res)
	}
	if res := exectest.Run(t, fn, `{"slow":1}`, exectest.Options{Deadline: 200 * time.Millisecond}); res.OK() || res.Error.Code != protocol.CodeTimeout {
		t.Errorf("deadline: %+v", res)
	}
	statuses := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		code, _ := strconv.Atoi(r.URL.Query().Get("status"))
		http.Error(w, "answer "+strconv.Itoa(code), code)
	}))
	defer statuses.Close()
	for _, tc := range []struct {
		status           int
		refused, retried bool
	}{
		{status: 400}, {status: 401}, {status: 404}, {status: 500},
		{status: 409, refused: true}, {status: 422, refused: true},
		{status: 429, retried: true}, {status: 503, retried: true},
	} {
		h, err := exec.HTTPHandler(statuses.URL+"?status="+strconv.Itoa(tc.status), nil)
		if err != nil {
			t.Fatal(err)
		}
		fn := exec.Function{Name: "eta", Handler: h}
		_, err = h.Handle(t.Context(), &exec.Invocation{Call: exectest.Call(fn, `{}`, exectest.Options{})})
		if err == nil || !strings.Contains(err.Error(), "answer "+strconv.Itoa(tc.status)) ||
			errors.Is(err, exec.ErrRefused) != tc.refused || errors.Is(err, exec.ErrRetryable) != tc.retried {
			t.Errorf("HTTP %d: %v; want refused %v, retryable %v", tc.status, err, tc.refused, tc.retried)
		}
	}
	for _, bad := range []string{"", "ftp://x", "/relative", "http://"} {
		if _, err := exec.HTTPHandler(bad, nil); err == nil {
			t.Errorf("HTTPHandler(%q) accepted", bad)
		}
	}
}

// alive reports whether pid runs: it exists and is not a zombie waiting to
// be reaped.
func alive(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}
