// Package deploy checks that the deployment files parse and agree with the
// names toolrelay uses.
package deploy

import (
	"bytes"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/toolrelay/toolrelay/pkg/protocol"
)

func TestYAMLFilesParse(t *testing.T) {
	for _, f := range []string{"compose.yaml", "otel-collector.yaml", "k8s/dispatcher.yaml", "k8s/executor-orders.yaml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Errorf("%s: %v", f, err)
				break
			}
		}
	}
}

func TestKEDAScalesTheTeamsConsumer(t *testing.T) {
	b, err := os.ReadFile("k8s/executor-orders.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"stream: " + protocol.CallStream("orders"), "consumer: get_order_status"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("the ScaledObject does not name %q", want)
		}
	}
}
