package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// fuzzResult is one fuzz target's run.
type fuzzResult struct {
	target, execs string
	passed        bool
	last          string
}

var fuzzFunc = regexp.MustCompile(`(?m)^func (Fuzz\w+)\(`)
var fuzzExecs = regexp.MustCompile(`execs: (\d+)`)

// runFuzzers runs every fuzz target of the wire contract's decoders
// (pkg/protocol) for d each, one after another.
func runFuzzers(ctx context.Context, repo string, d time.Duration) []fuzzResult {
	src, err := os.ReadFile(filepath.Join(repo, "pkg", "protocol", "fuzz_test.go"))
	if err != nil {
		return []fuzzResult{{target: "pkg/protocol", last: err.Error()}}
	}
	var out []fuzzResult
	for _, m := range fuzzFunc.FindAllStringSubmatch(string(src), -1) {
		name := m[1]
		cmd := osexec.CommandContext(ctx, "go", "test", "-run=^$", "-fuzz=^"+name+"$", "-fuzztime="+d.String(), "./pkg/protocol")
		cmd.Dir = repo
		b, err := cmd.CombinedOutput()
		r := fuzzResult{target: name, passed: err == nil}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			line := sc.Text()
			if e := fuzzExecs.FindStringSubmatch(line); e != nil {
				r.execs = e[1]
			}
			if strings.TrimSpace(line) != "" {
				r.last = line
			}
		}
		fmt.Printf("chaos: fuzz %-28s %s execs, passed %v\n", name, r.execs, r.passed)
		out = append(out, r)
	}
	return out
}
