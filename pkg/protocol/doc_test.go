package protocol

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// docs/protocol.md is the contract for people writing executors in other
// languages. Its example envelopes are the golden files of testdata/ and
// its tables of settings are rendered from the specs in streams.go, each
// between markers:
//
//	<!-- golden NAME -->        testdata/NAME.golden.json, indented
//	<!-- generated NAME -->     a table rendered by docSections[NAME]
//	<!-- end -->
//
// The test fails when a block differs from what it should hold, or when a
// golden envelope is not shown at all; go test -update rewrites the blocks.
var docPath = filepath.Join("..", "..", "docs", "protocol.md")

var docBlock = regexp.MustCompile(`(?s)<!-- (golden|generated) ([a-z_]+) -->\n(.*?)<!-- end -->`)

func TestDocMatchesContract(t *testing.T) {
	doc, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	var problems []string
	out := docBlock.ReplaceAllFunc(doc, func(block []byte) []byte {
		m := docBlock.FindSubmatch(block)
		kind, name, have := string(m[1]), string(m[2]), string(m[3])
		want, err := docBlockContent(kind, name)
		if err != nil {
			problems = append(problems, err.Error())
			return block
		}
		if kind == "golden" {
			shown[name] = true
		}
		if have != want {
			problems = append(problems, fmt.Sprintf("%s %s is out of date (-doc +want):\n%s", kind, name, cmp.Diff(have, want)))
		}
		return []byte(fmt.Sprintf("<!-- %s %s -->\n%s<!-- end -->", kind, name, want))
	})
	goldens, err := filepath.Glob(filepath.Join("testdata", "*.golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range goldens {
		if name := strings.TrimSuffix(filepath.Base(g), ".golden.json"); !shown[name] {
			problems = append(problems, fmt.Sprintf("golden envelope %s is not shown in %s: add <!-- golden %s --><!-- end --> where it belongs", name, docPath, name))
		}
	}
	if *update && !bytes.Equal(out, doc) {
		if err := os.WriteFile(docPath, out, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	for _, p := range problems {
		t.Errorf("%s (go test -update rewrites the blocks)", p)
	}
}

// docBlockContent is what a block of the doc must hold.
func docBlockContent(kind, name string) (string, error) {
	switch kind {
	case "golden":
		raw, err := os.ReadFile(filepath.Join("testdata", name+".golden.json"))
		if err != nil {
			return "", fmt.Errorf("doc shows golden %s: %w", name, err)
		}
		var b bytes.Buffer
		if err := json.Indent(&b, bytes.TrimSpace(raw), "", "  "); err != nil {
			return "", fmt.Errorf("golden %s: %w", name, err)
		}
		return "```json\n" + b.String() + "\n```\n", nil
	case "generated":
		render, ok := docSections[name]
		if !ok {
			return "", fmt.Errorf("doc has a generated block %q that nothing renders", name)
		}
		return render(), nil
	}
	return "", fmt.Errorf("unknown block kind %q", kind)
}

var docSections = map[string]func() string{
	"streams":  renderStreams,
	"buckets":  renderBuckets,
	"consumer": renderConsumer,
	"values":   renderValues,
	"codes":    renderCodes,
}

func renderValues() string {
	rows := [][3]string{
		{"header", "`" + HeaderCallKey + "`", "the call key, on calls, results and dead letters"},
		{"header", "`" + HeaderDeadline + "`", "the call's deadline (RFC 3339, UTC), on calls"},
		{"header", "`" + HeaderFunction + "`", "the function's name, on calls"},
		{"header", "`" + HeaderSchema + "`", "the digest of the parameter schema the dispatcher checked the call's arguments against, on calls: an executor with the same schema does not check them again"},
		{"header", "`" + HeaderReplay + "`", "the replay number (from 1) on a call an operator replayed from the dead letters"},
		{"envelope version", fmt.Sprint(Version), "`v` written; decoders accept 1 up to it and ignore unknown fields"},
		{"max envelope size", fmt.Sprint(MaxEnvelopeSize), "bytes of an encoded envelope"},
		{"max output size", fmt.Sprint(MaxOutputSize), "bytes of a result's `output`"},
		{"max arguments size", fmt.Sprint(MaxArgumentsSize), "bytes of one call's `arguments`: larger ones fail at intake (`invalid_arguments`)"},
		{"lease TTL", LeaseTTL.String(), "a declaration not renewed within it is removed by the server"},
		{"lease renewal", LeaseRenewal.String(), "how often an executor sends its declarations again"},
		{"declare wait", DeclareWait.String(), "how long an executor waits for the answer to one declare request before sending it again; a dispatcher answers within it"},
		{"cancel memory", CancelMemory.String(), "how long cancellations are kept, and how far back an executor reads them"},
		{"default ack wait", DefaultAckWait.String(), "report progress (`+WPI`) every third of it"},
		{"result max age", ResultMaxAge.String(), "the most a result's `Nats-TTL` may be, and how long a result without one is kept"},
		{"result min TTL", ResultMinTTL.String(), "the least a result's `Nats-TTL` is, even past the call's `keep_result_until`"},
	}
	var b strings.Builder
	b.WriteString("| name | value | meaning |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s | %s |\n", r[0], r[1], r[2])
	}
	return b.String()
}

func renderCodes() string {
	codes := []struct {
		code ErrorCode
		when string
	}{
		{CodeTimeout, "the call did not finish before its deadline"},
		{CodeInvalidArguments, "the arguments are not JSON, break the function's schema, or are over the max arguments size"},
		{CodeUnknownFunction, "no function of that name is registered (written by the dispatcher)"},
		{CodeUnavailable, "nothing serves the function, the run was cancelled, or it may have run and was not retried"},
		{CodeFunctionError, "the function ran and failed"},
		{CodeDenied, "the call needed a person's approval and was denied, or not approved in time; it did not run (written by the dispatcher; [approvals.md](approvals.md))"},
	}
	var b strings.Builder
	b.WriteString("| `type` | when |\n|---|---|\n")
	for _, c := range codes {
		if err := c.code.Validate(); err != nil {
			panic(err)
		}
		fmt.Fprintf(&b, "| `%s` | %s |\n", c.code, c.when)
	}
	return b.String()
}

func renderStreams() string {
	var b strings.Builder
	b.WriteString("| stream | created by | subjects | retention | discard | max msgs per subject | discard new per subject | max age | max bytes | duplicates window | max msg size | allow msg TTL | allow direct |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	row := func(s StreamSpec, by string) {
		fmt.Fprintf(&b, "| `%s` | %s | `%s` | %s | %s | %s | %t | %s | %s | %s | %s | %t | %t |\n",
			s.Name, by, strings.Join(s.Subjects, "`, `"), s.Retention, s.Discard, limit(s.MaxMsgsPerSubject),
			s.DiscardNewPerSubject, s.MaxAge, limit(s.MaxBytes), s.Duplicates, limit(int64(s.MaxMsgSize)), s.AllowMsgTTL, s.AllowDirect)
	}
	for _, s := range ExecutorStreams("<team>") {
		row(s, "executors")
	}
	for _, s := range ControlStreams("<team>", DefaultResultStreamBytes) {
		row(s, "dispatchers")
	}
	return b.String()
}

func renderBuckets() string {
	var b strings.Builder
	b.WriteString("| bucket (stream) | written by | history | TTL | limit marker TTL | holds |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	row := func(k BucketSpec, by string) {
		fmt.Fprintf(&b, "| `%s` (`KV_%s`) | %s | %d | %s | %s | %s |\n", k.Name, k.Name, by, k.History, duration(k.TTL), duration(k.LimitMarkerTTL), k.Description)
	}
	for _, k := range ExecutorBuckets() {
		row(k, "executors")
	}
	for _, k := range ControlBuckets() {
		row(k, "dispatchers only")
	}
	return b.String()
}

func renderConsumer() string {
	c := FunctionConsumerSpec("<team>", "<function>", 0, DefaultAckWait)
	var b strings.Builder
	b.WriteString("| setting | value |\n|---|---|\n")
	rows := [][2]string{
		{"stream", "`" + c.Stream + "`"},
		{"durable name", "`" + c.Durable + "`"},
		{"filter subject", "`" + c.FilterSubject + "`"},
		{"ack policy", string(c.AckPolicy)},
		{"deliver policy", string(c.DeliverPolicy)},
		{"ack wait", c.AckWait.String() + " by default (an executor may choose another)"},
		{"max deliver", fmt.Sprint(c.MaxDeliver) + " (unbounded: executors bound attempts)"},
		{"max ack pending", "the function's `max_concurrency`: a cap across every executor process"},
	}
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %s |\n", r[0], r[1])
	}
	return b.String()
}

func limit(n int64) string {
	if n <= 0 {
		return "none"
	}
	return fmt.Sprint(n)
}

func duration(d time.Duration) string {
	if d == 0 {
		return "none"
	}
	return d.String()
}
