package platformauth_test

import (
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/toolrelay/toolrelay/internal/platformauth"
	"github.com/toolrelay/toolrelay/internal/platformsim"
)

func TestFoundryBearerTokenIsRefreshedFromItsFile(t *testing.T) {
	sim := platformsim.New(platformsim.Options{APIKey: "token-1"})
	hs := httptest.NewServer(sim)
	defer func() { hs.CloseClientConnections(); sim.Close(); hs.Close() }()
	path := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(path, []byte("token-1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := platformauth.Options(platformauth.Config{BaseURL: hs.URL + "/api/projects/p1/openai/v1", TokenFile: path})
	if err != nil {
		t.Fatal(err)
	}
	c := openai.NewClient(append(opts, option.WithMaxRetries(0))...)
	ask := func() error {
		_, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}})
		return err
	}
	if err := ask(); err != nil {
		t.Fatalf("with the first token: %v", err)
	}
	// The platform rotates to token-2, and so does the file.
	sim2 := platformsim.New(platformsim.Options{APIKey: "token-2"})
	defer sim2.Close()
	hs.Config.Handler = sim2
	if err := ask(); err == nil {
		t.Fatal("the stale token was accepted")
	}
	if err := os.WriteFile(path, []byte("token-2"), 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Second)
	_ = os.Chtimes(path, future, future)
	if err := ask(); err != nil {
		t.Fatalf("after the refresh: %v", err)
	}
}

func TestAzureEndpoint(t *testing.T) {
	sim := platformsim.New(platformsim.Options{APIKey: "azure-key"})
	hs := httptest.NewServer(sim)
	defer func() { hs.CloseClientConnections(); sim.Close(); hs.Close() }()
	opts, err := platformauth.Options(platformauth.Config{AzureEndpoint: hs.URL, AzureAPIKey: "azure-key"})
	if err != nil {
		t.Fatal(err)
	}
	c := openai.NewClient(append(opts, option.WithMaxRetries(0))...)
	if _, err := c.Responses.New(t.Context(), responses.ResponseNewParams{Model: "m", Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hi")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := platformauth.Options(platformauth.Config{AzureEndpoint: hs.URL}); err == nil {
		t.Error("an Azure endpoint without a key was accepted")
	}
}
