// Package platformauth builds the openai-go client options for the ways
// toolrelay reaches a platform: OpenAI, a Microsoft Foundry project
// endpoint with a bearer token (refreshed from a file), or an Azure OpenAI
// endpoint.
//
// It may import only openai-go's option and azure packages; the dispatcher
// command uses it.
package platformauth

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3/azure"
	"github.com/openai/openai-go/v3/option"
)

// Config is how to reach the platform.
type Config struct {
	// APIKey is OPENAI_API_KEY: an OpenAI key, or a bearer token for a
	// Foundry project endpoint (the SDK sends it as Authorization: Bearer).
	APIKey string
	// BaseURL is OPENAI_BASE_URL; Foundry: {project endpoint}/openai/v1.
	BaseURL string
	// TokenFile holds a bearer token that something else refreshes (a
	// sidecar, a workload identity agent). It is re-read whenever it
	// changes and overrides APIKey.
	TokenFile string
	// AzureEndpoint and AzureAPIVersion select an Azure OpenAI resource
	// (https://<name>.openai.azure.com), authenticated by AzureAPIKey.
	AzureEndpoint   string
	AzureAPIVersion string
	AzureAPIKey     string
}

// Options returns the client options for c.
func Options(c Config) ([]option.RequestOption, error) {
	var opts []option.RequestOption
	if c.AzureEndpoint != "" {
		if c.BaseURL != "" {
			return nil, errors.New("platformauth: set either an Azure endpoint or OPENAI_BASE_URL, not both")
		}
		if c.AzureAPIKey == "" {
			return nil, errors.New("platformauth: the Azure endpoint needs AZURE_OPENAI_API_KEY")
		}
		version := c.AzureAPIVersion
		if version == "" {
			version = "2025-04-01-preview"
		}
		opts = append(opts, azure.WithEndpoint(c.AzureEndpoint, version), azure.WithAPIKey(c.AzureAPIKey))
		if u, err := url.Parse(c.AzureEndpoint); err == nil && u.Scheme == "http" {
			opts = append(opts, azure.WithUnsafeAllowHTTP()) // loopback only, per the SDK
		}
		return opts, nil
	}
	if c.APIKey != "" {
		opts = append(opts, option.WithAPIKey(c.APIKey))
	}
	if c.BaseURL != "" {
		opts = append(opts, option.WithBaseURL(c.BaseURL))
	}
	if c.TokenFile != "" {
		tf := &tokenFile{path: c.TokenFile}
		if _, err := tf.token(); err != nil {
			return nil, err
		}
		if c.APIKey == "" {
			opts = append(opts, option.WithAPIKey("from-token-file")) // replaced per request
		}
		opts = append(opts, option.WithMiddleware(tf.middleware))
	}
	return opts, nil
}

// tokenFile caches a token file's content, re-reading it when its size or
// modification time changes.
type tokenFile struct {
	path string

	mu      sync.Mutex
	mod     time.Time
	size    int64
	current string
}

func (t *tokenFile) token() (string, error) {
	st, err := os.Stat(t.path)
	if err != nil {
		return "", fmt.Errorf("platformauth: bearer token file: %w", err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.current != "" && st.ModTime().Equal(t.mod) && st.Size() == t.size {
		return t.current, nil
	}
	b, err := os.ReadFile(t.path)
	if err != nil {
		return "", fmt.Errorf("platformauth: bearer token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("platformauth: bearer token file %s is empty", t.path)
	}
	t.current, t.mod, t.size = tok, st.ModTime(), st.Size()
	return tok, nil
}

func (t *tokenFile) middleware(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	tok, err := t.token()
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	return next(req)
}
