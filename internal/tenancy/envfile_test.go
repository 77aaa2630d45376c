package tenancy_test

import (
	"maps"
	"os"
	osexec "os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/toolrelay/toolrelay/internal/tenancy"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Every env file nats-config writes can be sourced by a shell and sets
// exactly what the dispatcher and executors need, as written: "$JS..." is
// not expanded, and a directory whose path holds a space, a quote or a
// dollar sign survives. ReadEnvFile (which the benchmarks and the tenancy
// test use) reads the same values.
func TestEnvFilesSourceInAShell(t *testing.T) {
	sh, err := osexec.LookPath("sh")
	if err != nil {
		t.Skip("no sh on this machine")
	}
	dir := filepath.Join(t.TempDir(), `it's $HOME conf`)
	res, err := tenancy.Write(dir, tenancy.Options{Teams: []string{"orders", "billing"}, Cluster: 3})
	if err != nil {
		t.Fatal(err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"dispatcher": {"TOOLRELAY_TEAM_API_PREFIX": protocol.TeamAPIPrefixTemplate,
			"TOOLRELAY_TEAM_RESULT_BYTES": strconv.Itoa(protocol.DefaultResultStreamBytes)},
		"orders":  {"TOOLRELAY_CONTROL_API_PREFIX": protocol.ControlAPIPrefix},
		"billing": {"TOOLRELAY_CONTROL_API_PREFIX": protocol.ControlAPIPrefix},
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*.env"))
	if len(files) != len(want) {
		t.Fatalf("wrote %v, want one env file per user of %v", files, slices.Sorted(maps.Keys(want)))
	}
	for user, vars := range want {
		vars["NATS_URL"] = res.URL
		vars["NATS_NKEY"] = filepath.Join(abs, user+".nk")
		vars["TOOLRELAY_REPLICAS"] = "3"
		t.Run(user, func(t *testing.T) {
			file := filepath.Join(dir, user+".env")
			names := slices.Sorted(maps.Keys(vars))
			// Source the file in a clean environment and print each
			// variable NUL-terminated, exactly as the shell holds it.
			script := `set -a; . "$1" || exit 1; shift; for v in "$@"; do eval "printf '%s\0' \"\$$v\""; done`
			cmd := osexec.Command(sh, append([]string{"-c", script, "sh", file}, names...)...)
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=/nowhere"}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("sourcing %s: %v", file, err)
			}
			got := map[string]string{}
			values := strings.Split(strings.TrimSuffix(string(out), "\x00"), "\x00")
			for i, name := range names {
				if i < len(values) {
					got[name] = values[i]
				}
			}
			if diff := cmp.Diff(vars, got); diff != "" {
				t.Errorf("a shell sourcing %s sets (-want +got):\n%s", file, diff)
			}
			read, err := tenancy.ReadEnvFile(file)
			if err != nil {
				t.Fatal(err)
			}
			fromGo := map[string]string{}
			for _, kv := range read {
				k, v, _ := strings.Cut(kv, "=")
				fromGo[k] = v
			}
			if diff := cmp.Diff(vars, fromGo); diff != "" {
				t.Errorf("ReadEnvFile(%s) (-want +got):\n%s", file, diff)
			}
		})
	}
}
