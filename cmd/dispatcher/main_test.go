package main

import (
	"bytes"
	"strings"
	"testing"
)

// "dispatcher -h" lists every command, and the service's settings.
func TestHelpListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		var out, errOut bytes.Buffer
		if err := run(t.Context(), args, &out, &errOut); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		for _, want := range []string{"serve", "demo", "simulator", "tools", "token", "TOOLRELAY_SHUTDOWN_TIMEOUT", "TOOLRELAY_API_TOKENS_FILE"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("%v does not mention %s:\n%s", args, want, out.String())
			}
		}
	}
}
