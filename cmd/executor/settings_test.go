package main

import (
	"testing"

	"github.com/kelseyhightower/envconfig"

	"github.com/toolrelay/toolrelay/pkg/exec"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// The executor's settings default to the library's defaults.
func TestSettingsDefaultToTheLibrarysDefaults(t *testing.T) {
	var cfg config
	if err := envconfig.Process("", &cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.ShutdownTimeout != exec.DefaultShutdownTimeout {
		t.Errorf("TOOLRELAY_SHUTDOWN_TIMEOUT defaults to %s; the library's default is %s", cfg.ShutdownTimeout, exec.DefaultShutdownTimeout)
	}
	if cfg.AckWait != protocol.DefaultAckWait {
		t.Errorf("TOOLRELAY_ACK_WAIT defaults to %s; the contract's default is %s", cfg.AckWait, protocol.DefaultAckWait)
	}
}
