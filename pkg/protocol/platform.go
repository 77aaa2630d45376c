package protocol

import "fmt"

// Platform names an agent platform.
type Platform string

// The platforms toolrelay serves.
const (
	// PlatformAgents is OpenAI Agents sessions: required_actions answered by
	// agent.session.input.tool_result events.
	PlatformAgents Platform = "agents"
	// PlatformAssistants is OpenAI and Azure Assistants runs: requires_action
	// answered by one submit_tool_outputs carrying every output.
	PlatformAssistants Platform = "assistants"
	// PlatformResponses is the Responses API and Microsoft Foundry agents:
	// function_call items answered by function_call_output items.
	PlatformResponses Platform = "responses"
	// PlatformMCP is the dispatcher's MCP front door (/mcp): each tools/call
	// is a turn of one call, answered to the waiting MCP client. It is no
	// agent platform of its own, so it is not in Platforms.
	PlatformMCP Platform = "mcp"
)

// Platforms lists every platform, in a stable order.
var Platforms = []Platform{PlatformAgents, PlatformAssistants, PlatformResponses}

// Validate reports whether p is a known platform.
func (p Platform) Validate() error {
	switch p {
	case PlatformAgents, PlatformAssistants, PlatformResponses, PlatformMCP:
		return nil
	}
	return fmt.Errorf("protocol: unknown platform %q (want agents, assistants, responses or mcp)", string(p))
}
