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
	"github.com/toolrelay/toolrelay/pkg/protocol"
)

// Team owns the seed functions.
const Team = "demo"

// Functions returns the seed functions, and get_sign_dates, a custom tool
// of the Responses API: it takes the model's text, a sign's name, which a
// regex grammar constrains.
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
			Name:        "get_sign_dates",
			Description: "Get the birthdays an astrological sign covers. Input: the sign's name, e.g. Aquarius.",
			Format:      &protocol.InputFormat{Type: protocol.FormatGrammar, Syntax: protocol.SyntaxRegex, Definition: signGrammar},
			Handler: exec.HandlerFunc(func(ctx context.Context, inv *exec.Invocation) ([]byte, error) {
				sign, _ := inv.Input()
				dates, ok := signDates[sign]
				if !ok {
					return nil, fmt.Errorf("%q is not an astrological sign; write one of %s", sign, signGrammar)
				}
				return []byte(sign + " birthdays fall between " + dates + "."), nil
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

// signGrammar is get_sign_dates' regex grammar: the input is exactly one
// sign's name.
const signGrammar = "Aries|Taurus|Gemini|Cancer|Leo|Virgo|Libra|Scorpio|Sagittarius|Capricorn|Aquarius|Pisces"

// signDates are the birthdays of each sign of the tropical zodiac.
var signDates = map[string]string{
	"Aries": "March 21 and April 19", "Taurus": "April 20 and May 20", "Gemini": "May 21 and June 20",
	"Cancer": "June 21 and July 22", "Leo": "July 23 and August 22", "Virgo": "August 23 and September 22",
	"Libra": "September 23 and October 22", "Scorpio": "October 23 and November 21",
	"Sagittarius": "November 22 and December 21", "Capricorn": "December 22 and January 19",
	"Aquarius": "January 20 and February 18", "Pisces": "February 19 and March 20",
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
