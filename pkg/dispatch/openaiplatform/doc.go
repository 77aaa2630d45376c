// Package openaiplatform adapts the platforms the official openai-go SDK
// reaches to the dispatcher's [dispatch.Platform]: OpenAI Agents sessions,
// OpenAI and Azure Assistants runs (OpenAI retired the Assistants API in
// August 2026; the adapter serves Azure and Foundry classic agents until
// they retire) and the Responses API, Microsoft Foundry agents included.
// [Webhooks] verifies OpenAI's signed webhooks for the dispatcher.
//
// Errors the platform returns are [dispatch.PlatformError]s, retryable for
// 408, 409, 429, 5xx and transport errors, with the Retry-After the
// platform asked for. Submissions are safe to repeat: a platform's "already
// submitted" or "not waiting any more" answer counts as success.
//
// It imports pkg/dispatch, pkg/protocol and openai-go; the engine
// (pkg/dispatch) does not import it.
package openaiplatform
