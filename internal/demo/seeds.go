// Package demo holds the seed functions of the platforms' function-calling
// examples and the all-in-one demo that plays them through toolrelay.
//
// It wires the whole system as the commands do, so it may import pkg/exec,
// pkg/dispatch and its openaiplatform, pkg/protocol, internal/natsembed,
// internal/platformsim, nats.go and openai-go; only cmd/ and tests import
// it.
package demo

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/toolrelay/toolrelay/pkg/exec"
)

// Team owns the seed functions.
const Team = "demo"

// Functions returns the seed functions.
func Functions() []exec.Function {
	return []exec.Function{
		{
			Name:        "get_customer",
			Description: "Look up a customer by ID.",
			Parameters:  schema(`{"customer_id":{"type":"string","description":"The customer's ID"}}`, "customer_id"),
			Handler: typed(func(ctx context.Context, a struct {
				CustomerID string `json:"customer_id"`
			}) (any, error) {
				if a.CustomerID != "123" {
					return nil, fmt.Errorf("no customer has ID %q; ask the user to check the customer ID", a.CustomerID)
				}
				return map[string]string{"name": "Example Customer", "plan": "pro"}, nil
			}),
		},
		{
			Name:        "get_weather",
			Description: "Get the current weather for a location.",
			Parameters:  schema(`{"location":{"type":"string","description":"City and country, e.g. Paris, France"}}`, "location"),
			Handler: typed(func(ctx context.Context, a struct {
				Location string `json:"location"`
			}) (any, error) {
				return map[string]string{"location": a.Location, "conditions": "partly cloudy", "temperature": "14c"}, nil
			}),
		},
		{
			Name:        "get_horoscope",
			Description: "Get today's horoscope for an astrological sign.",
			Parameters:  schema(`{"sign":{"type":"string","description":"An astrological sign like Taurus or Aquarius"}}`, "sign"),
			Handler: typed(func(ctx context.Context, a struct {
				Sign string `json:"sign"`
			}) (any, error) {
				return a.Sign + ": Next Tuesday you will befriend a baby otter.", nil
			}),
		},
		{
			Name:        "getUserFavoriteCity",
			Description: "Gets the user's favorite city.",
			Parameters:  schema(`{}`),
			Handler: typed(func(ctx context.Context, a struct{}) (any, error) {
				return "Seattle, WA", nil
			}),
		},
		{
			Name:        "getCityNickname",
			Description: "Gets the nickname of a city, e.g. 'LA' for 'Los Angeles, CA'.",
			Parameters:  schema(`{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"}}`, "location"),
			Handler: typed(func(ctx context.Context, a struct {
				Location string `json:"location"`
			}) (any, error) {
				if !strings.HasPrefix(a.Location, "Seattle") {
					return nil, fmt.Errorf("no nickname is known for %q", a.Location)
				}
				return "The Emerald City", nil
			}),
		},
		{
			Name:        "getCurrentWeatherAtLocation",
			Description: "Gets the current weather at a location.",
			Parameters: schema(`{"location":{"type":"string","description":"The city and state, e.g. San Francisco, CA"},
				"unit":{"type":"string","enum":["c","f"]}}`, "location"),
			Handler: typed(func(ctx context.Context, a struct {
				Location string `json:"location"`
				Unit     string `json:"unit"`
			}) (any, error) {
				if a.Unit == "c" {
					return "21c", nil
				}
				return "70f", nil
			}),
		},
	}
}

// schema builds an object schema with the given properties and required
// names, refusing other properties.
func schema(properties string, required ...string) json.RawMessage {
	req, _ := json.Marshal(required)
	if required == nil {
		req = []byte("[]")
	}
	return json.RawMessage(fmt.Sprintf(`{"type":"object","properties":%s,"required":%s,"additionalProperties":false}`, properties, req))
}

// typed adapts a function of decoded arguments. A string result is the
// output as is; anything else is encoded as JSON.
func typed[A any](f func(context.Context, A) (any, error)) exec.Handler {
	return exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
		var args A
		if err := json.Unmarshal(inv.Call.Arguments, &args); err != nil {
			return nil, fmt.Errorf("the arguments do not fit %s: %v", inv.Call.Function, err)
		}
		out, err := f(ctx, args)
		if err != nil {
			return nil, err
		}
		if s, ok := out.(string); ok {
			return []byte(s), nil
		}
		return json.Marshal(out)
	})
}
