package functionsfile

import (
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/toolrelay/toolrelay/internal/yamlfile"
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// approvalConfig is a function's approval: the word required, or a
// mapping of required: true or when: <CEL condition over args>, and
// approvers.
type approvalConfig struct {
	policy protocol.ApprovalPolicy
}

func (a *approvalConfig) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	const example = `approval: required, or approval: {when: "args.amount > 100", approvers: [team, admin]}`
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Value != "required" {
			return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: approval: %s was given; want %s", n.Line, yamlfile.Given(n), example)}}
		}
		a.policy.Required = true
		return nil
	case yaml.MappingNode:
	default:
		return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: approval: %s was given; want %s", n.Line, yamlfile.Given(n), example)}}
	}
	// Decoded by hand: a node's Decode does not refuse unknown keys, and
	// a misspelt "approvers" must not leave the function approved by anyone.
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		var err error
		switch k.Value {
		case "required":
			err = v.Decode(&a.policy.Required)
		case "when":
			err = v.Decode(&a.policy.When)
		case "approvers":
			err = v.Decode(&a.policy.Approvers)
		default:
			return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: approval: unknown key %q; want required, when or approvers", k.Line, k.Value)}}
		}
		if err != nil {
			return &yaml.TypeError{Errors: []string{fmt.Sprintf("line %d: approval.%s: %v", v.Line, k.Value, err)}}
		}
	}
	return nil
}
