package main

import (
	"bytes"
	"testing"
)

// From a new user's first hour: a flag after the function name printed the
// whole usage. The error names the flag and shows the flags first.
func TestCallSaysFlagsGoBeforeTheFunctionName(t *testing.T) {
	for name, tc := range map[string]struct {
		args []string
		want string
	}{
		"-addr": {[]string{"get_order_status", "-addr", "127.0.0.1:8081", `{"order_id":"A-1"}`},
			`flags go before the function name: -addr came after "get_order_status"; write: dispatcher call -addr 127.0.0.1:8081 get_order_status '{"order_id":"A-1"}'`},
		"-json, a bool": {[]string{"get_order_status", `{"order_id":"A-1"}`, "-json"},
			`flags go before the function name: -json came after "get_order_status"; write: dispatcher call -json get_order_status '{"order_id":"A-1"}'`},
		"--addr=": {[]string{"-json", "f", "--addr=http://h:1"},
			`flags go before the function name: --addr=http://h:1 came after "f"; write: dispatcher call -json --addr=http://h:1 f`},
	} {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := callCmd(t.Context(), tc.args, &stdout, &stderr)
			if err == nil || err.Error() != tc.want {
				t.Errorf("error = %v\nwant %s", err, tc.want)
			}
			if stderr.Len() > 0 {
				t.Errorf("printed %q; want the error alone, not the usage", stderr.String())
			}
		})
	}
}
