package platformsim

// Seed scenarios: the examples of the three platforms' function-calling
// guides, played by the demo.
var (
	// CustomerScenario: two independent lookups in parallel (Agents). The
	// answer reads fields of the functions' JSON outputs.
	CustomerScenario = Scenario{
		Name:   "customer",
		Prompt: "customer 123",
		Steps: []Step{{
			{Name: "get_customer", Arguments: `{"customer_id":"123"}`},
			{Name: "get_weather", Arguments: `{"location":"Paris, France"}`},
		}},
		Answer: `Customer 123 is {{field (out "get_customer") "name"}} on the {{field (out "get_customer") "plan"}} plan. In {{field (out "get_weather") "location"}} it is {{field (out "get_weather") "conditions"}} and {{field (out "get_weather") "temperature"}}.`,
	}
	// FavoriteCityScenario: the Azure OpenAI Assistants sample, where the
	// second step needs the first step's output.
	FavoriteCityScenario = Scenario{
		Name:   "favorite-city",
		Prompt: "favorite city",
		Steps: []Step{
			{{Name: "getUserFavoriteCity"}},
			{
				{Name: "getCityNickname", Arguments: `{"location":{{json (out "getUserFavoriteCity")}}}`},
				{Name: "getCurrentWeatherAtLocation", Arguments: `{"location":{{json (out "getUserFavoriteCity")}},"unit":"f"}`},
			},
		},
		Answer: `Your favorite city, {{out "getUserFavoriteCity"}}, is also known as {{out "getCityNickname"}}. The current weather there is {{out "getCurrentWeatherAtLocation"}}.`,
	}
	// HoroscopeScenario: the OpenAI function-calling guide (Responses).
	HoroscopeScenario = Scenario{
		Name:   "horoscope",
		Prompt: "horoscope",
		Steps:  []Step{{{Name: "get_horoscope", Arguments: `{"sign":"Aquarius"}`}}},
		Answer: `Your horoscope: {{out "get_horoscope"}}`,
	}
)

// SeedScenarios are the scenarios the demo plays.
func SeedScenarios() []Scenario {
	return []Scenario{CustomerScenario, FavoriteCityScenario, HoroscopeScenario}
}
