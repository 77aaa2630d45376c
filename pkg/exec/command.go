package exec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	osexec "os/exec"
	"strings"
	"time"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// CommandHandler runs argv for each call: the arguments JSON on stdin (for
// a custom tool, the model's text as it is), the output read from stdout. A non-zero exit is a failed call whose message is
// the command's stderr. Two exit statuses say more: 75 (EX_TEMPFAIL) marks
// the failure retryable, and 65 (EX_DATAERR) marks it an expected refusal
// of this request ([ErrRefused]: not retried, no dead letter); any other
// failure leaves a dead letter. The command runs in a process group of its own, which is
// killed (SIGKILL) at the call's deadline, when the command exits (so
// nothing it left in the background outlives the call) and when the
// executor dies, even by SIGKILL (see runInGroup). Each call costs a small
// /bin/sh guard process besides the command.
//
// The command inherits the executor's environment plus
// TOOLRELAY_FUNCTION, TOOLRELAY_CALL_ID, TOOLRELAY_CALL_KEY and
// TOOLRELAY_DEADLINE (RFC 3339).
func CommandHandler(argv []string) (Handler, error) {
	if len(argv) == 0 || argv[0] == "" {
		return nil, errors.New("exec: command is empty")
	}
	path, err := osexec.LookPath(argv[0])
	if err != nil {
		return nil, fmt.Errorf("exec: command %q: %w", argv[0], err)
	}
	args := append([]string(nil), argv[1:]...)
	return HandlerFunc(func(ctx context.Context, inv *Invocation) ([]byte, error) {
		cmd := osexec.CommandContext(ctx, path, args...)
		// Children that keep stdout open must not keep the call waiting.
		cmd.WaitDelay = time.Second
		cmd.Stdin = bytes.NewReader(inv.Call.Arguments)
		if input, ok := inv.Input(); ok {
			cmd.Stdin = strings.NewReader(input) // a custom tool's text, as it is
		}
		cmd.Env = append(cmd.Environ(),
			"TOOLRELAY_FUNCTION="+inv.Call.Function,
			"TOOLRELAY_CALL_ID="+inv.Call.CallID,
			"TOOLRELAY_CALL_KEY="+string(inv.Call.Key),
			"TOOLRELAY_DEADLINE="+inv.Call.Deadline.Format(time.RFC3339Nano),
		)
		stdout := &capped{limit: protocol.MaxOutputSize + 1}
		stderr := &capped{limit: 4096}
		cmd.Stdout, cmd.Stderr = stdout, stderr
		err := runInGroup(cmd)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil {
			msg := strings.TrimSpace(stderr.String())
			if msg == "" {
				msg = "no error output"
			}
			var exitErr *osexec.ExitError
			if errors.As(err, &exitErr) {
				err := fmt.Errorf("%s failed (%s): %s", inv.Call.Function, exitErr.ProcessState, msg)
				switch exitErr.ExitCode() {
				case exitTempFail:
					return nil, Retryable(err)
				case exitRefused:
					return nil, Refuse(err)
				}
				return nil, err
			}
			return nil, fmt.Errorf("%s could not run: %v", inv.Call.Function, err)
		}
		return stdout.Bytes(), nil
	}), nil
}

const (
	// exitTempFail is sysexits.h's EX_TEMPFAIL: "try again later".
	exitTempFail = 75
	// exitRefused is sysexits.h's EX_DATAERR, "the input data was
	// incorrect": the command declines this request, as designed.
	exitRefused = 65
)

// capped keeps at most limit bytes and discards the rest, so a chatty
// command cannot exhaust memory.
type capped struct {
	bytes.Buffer
	limit int
}

func (c *capped) Write(p []byte) (int, error) {
	if room := c.limit - c.Len(); room > 0 {
		c.Buffer.Write(p[:min(len(p), room)])
	}
	return len(p), nil
}

var _ io.Writer = (*capped)(nil)
