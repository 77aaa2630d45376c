package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

func responsesParams(prompt string) responses.ResponseNewParams {
	return responses.ResponseNewParams{Model: "gpt-5.5", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(prompt)}}
}

// newToken runs dispatcher token -file file with args and returns the new
// token it prints.
func newToken(t *testing.T, file string, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(t.Context(), append([]string{"token", "-file", file}, args...), &out, &errOut); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(out.String())
}
