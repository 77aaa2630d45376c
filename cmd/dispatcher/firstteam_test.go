package main

import (
	"context"
	"io"
	"net"
	"os"
	osexec "os/exec"
	"strings"
	"testing"
	"time"

	"github.com/toolrelay/toolrelay/internal/testutil"
)

// The curl block of docs/first-team.md that drives the simulator by hand
// runs as written against `dispatcher simulator`: each platform's request
// creates its object (the Assistants one needs assistants=v2, the Agents
// one agents=v1 and an environment).
func TestFirstTeamCurlsWorkOnTheSimulator(t *testing.T) {
	if _, err := osexec.LookPath("curl"); err != nil {
		t.Skip("no curl")
	}
	doc, err := os.ReadFile("../../docs/first-team.md")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(doc), "<!-- simulator-by-hand")
	block, _, ok2 := strings.Cut(block, "<!-- end simulator-by-hand -->")
	_, block, ok3 := strings.Cut(block, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal("docs/first-team.md lost its simulator-by-hand block")
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- simulatorCmd(ctx, []string{"-addr", addr}, io.Discard, io.Discard) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitForWhat(t, 10*time.Second, "the simulator to listen on "+addr, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
		}
		return err == nil
	})

	script := strings.ReplaceAll(block, "127.0.0.1:8090", addr)
	out, err := osexec.CommandContext(t.Context(), "sh", "-ec", script).CombinedOutput()
	if err != nil {
		t.Fatalf("the documented requests: %v\n%s", err, out)
	}
	for _, want := range []string{`"object":"response"`, `"id":"resp_`, `"object":"thread.run"`, `"thread_id":"thread_`,
		`"object":"agent.session"`, `"id":"as_`} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the documented requests' answers lack %s:\n%s", want, out)
		}
	}
	if strings.Contains(string(out), `"error"`) && strings.Contains(string(out), "invalid_request_error") {
		t.Errorf("a documented request was refused:\n%s", out)
	}
}
