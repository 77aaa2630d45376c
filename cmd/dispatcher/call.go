package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// callCmd runs one function on the fleet through a running dispatcher's
// MCP front door (/mcp): the same path as a platform's call — schema
// validation, a deadline, JetStream, executors, retries — answered on the
// request. It prints the output on stdout and the trace ID on stderr, and
// fails (exit 1) with the model-readable message when the call fails.
func callCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("dispatcher call", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", apiAddr(), "the dispatcher's HTTP API (of the service, or of dispatcher dev), as a URL or host:port (default from "+APIURLEnv+")")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up waiting after this long (the dispatcher's TOOLRELAY_MCP_CALL_TIMEOUT bounds the call itself)")
	asJSON := fs.Bool("json", false, "print {\"function\",\"output\"|\"error\",\"trace_id\"} as JSON on stdout instead")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: dispatcher call [-addr http://127.0.0.1:8080] [-json] <function> ['<arguments JSON>' | -]\n\n"+
			"Runs one function on the fleet through the dispatcher's /mcp, as a platform's call runs, and prints\n"+
			"its output (stdout) and trace ID (stderr). A failed call prints its message and exits 1.\n"+
			"Arguments default to {}; - reads them from stdin. TOOLRELAY_API_TOKEN is sent as the bearer token.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := flagAfter(fs, args, "the function name"); err != nil {
		return err
	}
	if fs.NArg() < 1 || fs.NArg() > 2 {
		fs.Usage()
		return errors.New("give a function name and, optionally, its arguments as a JSON object")
	}
	name, raw := fs.Arg(0), "{}"
	if fs.NArg() == 2 {
		raw = fs.Arg(1)
	}
	if raw == "-" {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return fmt.Errorf("read arguments from stdin: %w", err)
		}
		raw = string(b)
	}
	var obj map[string]any
	if err := json.Unmarshal([]byte(raw), &obj); err != nil || obj == nil {
		return fmt.Errorf("arguments of %s must be a JSON object such as '{\"order_id\":\"A-1001\"}': %q", name, raw)
	}
	endpoint := apiBase(*addr) + "/mcp"

	traceID, traceparent := newTraceparent()
	header := http.Header{"Traceparent": {traceparent}}
	if token := os.Getenv(APITokenEnv); token != "" {
		header.Set("Authorization", "Bearer "+token)
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	client := mcp.NewClient(&mcp.Implementation{Name: "toolrelay-call", Version: "1"}, nil)
	session, err := client.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint: endpoint, HTTPClient: &http.Client{Transport: withHeader{header, http.DefaultTransport}}, DisableStandaloneSSE: true,
	}, nil)
	if err != nil {
		hint := " (is the dispatcher running there? see -addr)"
		if strings.Contains(err.Error(), "Unauthorized") && os.Getenv(APITokenEnv) == "" {
			hint = " (set " + APITokenEnv + ")"
		}
		return fmt.Errorf("connect to %s: %w%s", endpoint, err, hint)
	}
	defer session.Close()
	res, err := session.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: json.RawMessage(raw)})
	if err != nil {
		var rpc *jsonrpc.Error
		if errors.As(err, &rpc) {
			return fmt.Errorf("call %s: %s", name, rpc.Message)
		}
		return fmt.Errorf("call %s: %w", name, err)
	}
	var text strings.Builder
	for _, c := range res.Content {
		if t, ok := c.(*mcp.TextContent); ok {
			text.WriteString(t.Text)
		}
	}
	errType, _ := res.Meta["io.toolrelay/error_type"].(string)
	if *asJSON {
		out := map[string]any{"function": name, "trace_id": traceID}
		if res.IsError {
			out["error"] = map[string]string{"type": errType, "message": text.String()}
		} else {
			out["output"] = text.String()
		}
		if err := printJSON(stdout, out); err != nil {
			return err
		}
	} else if !res.IsError {
		fmt.Fprint(stdout, text.String())
		if !strings.HasSuffix(text.String(), "\n") {
			fmt.Fprintln(stdout)
		}
	}
	fmt.Fprintf(stderr, "trace %s\n", traceID)
	if res.IsError {
		if errType == "" {
			errType = "error"
		}
		return fmt.Errorf("%s failed (%s): %s", name, errType, text.String())
	}
	return nil
}

// newTraceparent starts a trace for the call: its spans on the dispatcher
// and the executors join it, so its ID finds them in a trace backend.
func newTraceparent() (traceID, header string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	traceID = hex.EncodeToString(b[:16])
	return traceID, "00-" + traceID + "-" + hex.EncodeToString(b[16:]) + "-01"
}

// withHeader adds headers to every request.
type withHeader struct {
	h    http.Header
	next http.RoundTripper
}

func (w withHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range w.h {
		r.Header[k] = v
	}
	return w.next.RoundTrip(r)
}

// flagAfter reports a flag of fs given after the first of its arguments
// (what), where the flag package stops reading flags and would take it
// for an argument: it names the flag and shows the command line (all, as
// parsed by fs) with the flags first.
func flagAfter(fs *flag.FlagSet, all []string, what string) error {
	args := fs.Args()
	before := all[:len(all)-len(args)]
	for i := 1; i < len(args); i++ {
		name, _, _ := strings.Cut(strings.TrimLeft(args[i], "-"), "=")
		if !strings.HasPrefix(args[i], "-") || fs.Lookup(name) == nil {
			continue
		}
		var flags, rest []string
		for j := 1; j < len(args); j++ {
			n, _, hasValue := strings.Cut(strings.TrimLeft(args[j], "-"), "=")
			f := fs.Lookup(n)
			if !strings.HasPrefix(args[j], "-") || f == nil {
				rest = append(rest, args[j])
				continue
			}
			flags = append(flags, args[j])
			if b, ok := f.Value.(interface{ IsBoolFlag() bool }); !hasValue && !(ok && b.IsBoolFlag()) && j+1 < len(args) {
				j++
				flags = append(flags, args[j])
			}
		}
		line := append(append(append(slices.Clone(before), flags...), args[0]), rest...)
		return fmt.Errorf("flags go before %s: %s came after %q; write: %s %s", what, args[i], args[0], fs.Name(), shellLine(line))
	}
	return nil
}

// shellLine joins args as a shell would read them back, quoting those
// that need it.
func shellLine(args []string) string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = a
		if a == "" || strings.ContainsAny(a, " \t\"'{}[]$*?;&|<>()`\\!#") {
			out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
	}
	return strings.Join(out, " ")
}
