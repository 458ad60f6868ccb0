package keystore

// A key's windows beside its minute: a second, an hour and a day. A plan may give its
// keys a limit in each, and a key may narrow its plan's, as it does the minute
// (docs/configuration.md, Budgets and restricted keys).

// Window is one of a key's rate limit windows beside its minute.
type Window int

// The windows beside the minute.
const (
	PerSecond Window = iota
	PerHour
	PerDay
)

// NumWindows is how many windows there are beside the minute.
const NumWindows = 3

// The names of a key's own limits in its windows, as the API and the audit trail
// spell them. A plan's are the same with "api_" before them.
const (
	FieldRateLimitPerSecond = "rate_limit_per_second"
	FieldRateLimitPerHour   = "rate_limit_per_hour"
	FieldRateLimitPerDay    = "rate_limit_per_day"
)

var (
	windowFields = [NumWindows]string{FieldRateLimitPerSecond, FieldRateLimitPerHour, FieldRateLimitPerDay}
	windowUnits  = [NumWindows]string{"a second", "an hour", "a day"}
)

// Field returns the name of a key's own limit in w, "rate_limit_per_second" and so on.
func (w Window) Field() string { return windowFields[w] }

// Unit returns w as it follows a number of requests: "a second", "an hour", "a day".
func (w Window) Unit() string { return windowUnits[w] }

// WindowLimits are a key's own limits in its windows, by Window; nil is its plan's.
type WindowLimits [NumWindows]*int

// planLimits are the limits a plan gives each key: its minute's api_rate_limit (0 no
// API access, -1 unlimited) and its windows' (-1 none).
type planLimits struct {
	minute  int
	windows [NumWindows]int
}

// checkLimits checks a key's own limits against p: the minute's rateLimit and those
// of windows, each set one from 1 to its plan's (any positive 32-bit number where
// the plan has none), none on a plan without API access.
func (p planLimits) checkLimits(rateLimit *int, windows WindowLimits) error {
	if rateLimit != nil {
		if err := checkRateLimit(FieldRateLimit, *rateLimit, p.minute); err != nil {
			return err
		}
	}
	for w, n := range windows {
		if n == nil {
			continue
		}
		limit := p.windows[w]
		if p.minute == 0 {
			limit = 0
		}
		if err := checkRateLimit(Window(w).Field(), *n, limit); err != nil {
			return err
		}
	}
	return nil
}
