package platformsim

import (
	"context"
	"fmt"

	"github.com/openai/openai-go/v3"
)

// StartAssistantsRun creates an assistant and starts a run on a new thread
// whose user message is prompt, through the official SDK, as a user of the
// Assistants API would. metadata is the run's (the simulator reads its run
// TTL from it); it may be nil.
func StartAssistantsRun(ctx context.Context, client openai.Client, prompt string, metadata map[string]string) (*openai.Run, error) {
	a, err := client.Beta.Assistants.New(ctx, openai.BetaAssistantNewParams{Model: "gpt-4o"})
	if err != nil {
		return nil, fmt.Errorf("create assistant: %w", err)
	}
	r, err := client.Beta.Threads.NewAndRun(ctx, openai.BetaThreadNewAndRunParams{
		AssistantID: a.ID, Metadata: metadata,
		Thread: openai.BetaThreadNewAndRunParamsThread{Messages: []openai.BetaThreadNewAndRunParamsThreadMessage{{
			Role: "user", Content: openai.BetaThreadNewAndRunParamsThreadMessageContentUnion{OfString: openai.String(prompt)},
		}}},
	})
	if err != nil {
		return nil, fmt.Errorf("create run: %w", err)
	}
	return r, nil
}
