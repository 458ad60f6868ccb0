package limiter

import (
	"errors"
	"time"
)

// Budgets are the budgets one request counts against, in the order Allow counts them:
// its key's windows, its organisation's minute, its organisation's UTC calendar month.
// A budget or window applies when its limit is positive; zero or less means none. A
// request with its key's windows alone is counted on that key's own counters, as it
// always was; one with an organisation budget counts on counters of the
// organisation's (see Redis.Allow).
type Budgets struct {
	// Key is the API key's id; KeyLimit its requests per minute window.
	Key      string
	KeyLimit int
	// KeyPerSecond, KeyPerHour and KeyPerDay are the key's limits in its windows
	// beside its minute. The key's windows are one budget: a request passes it when
	// its cost fits in every window the key has.
	KeyPerSecond, KeyPerHour, KeyPerDay int
	// Org is the organisation's id, needed by the two budgets after the key's.
	Org string
	// OrgLimit is the org's requests per minute window, across all its keys.
	OrgLimit int
	// MonthLimit is the org's requests per UTC calendar month, across all its keys.
	MonthLimit int64
	// Cost is how many units the request weighs at every budget and window: it passes
	// one only when its whole cost fits in what the budget has left, and counts all of
	// it there; otherwise it is refused whole, counted nowhere from there on, nor in
	// the key's windows that still had room. Limits are in units. Default (0): 1.
	Cost int
}

// limits are the limits of one request's budgets: its key's windows by span, its
// org's minute and month; zero or less for none.
type limits struct {
	key   [spans]int
	org   int
	month int64
}

// limits returns b's limits.
func (b Budgets) limits() limits {
	return limits{key: [spans]int{Minute: b.KeyLimit, Second: b.KeyPerSecond, Hour: b.KeyPerHour, Day: b.KeyPerDay},
		org: b.OrgLimit, month: b.MonthLimit}
}

// keyWide reports whether l has a window of the key's.
func (l *limits) keyWide() bool {
	for _, n := range l.key {
		if n > 0 {
			return true
		}
	}
	return false
}

// cost is b's Cost, 1 when unset.
func (b Budgets) cost() int64 {
	if b.Cost <= 0 {
		return 1
	}
	return int64(b.Cost)
}

// orgWide reports whether b has a budget of its organisation's.
func (b Budgets) orgWide() bool { return b.OrgLimit > 0 || b.MonthLimit > 0 }

func (b Budgets) check() error {
	if l := b.limits(); !l.keyWide() && !b.orgWide() || b.Cost < 0 {
		return ErrBadLimit
	}
	if b.orgWide() && b.Org == "" {
		return ErrNoOrg
	}
	return nil
}

// ErrNoOrg is returned by Allow for an organisation's budget without an
// organisation.
var ErrNoOrg = errors.New("limiter: an organisation's budget needs its id")

// Stage names one of the budgets of a Budgets, in the order they are counted.
type Stage uint8

const (
	StageNone  Stage = iota // no stage: the request passed every budget
	StageKey                // the key's windows
	StageOrg                // the org's minute
	StageMonth              // the org's month
)

// String returns "key", "org", "month", or "" for StageNone.
func (s Stage) String() string {
	switch s {
	case StageKey:
		return "key"
	case StageOrg:
		return "org"
	case StageMonth:
		return "month"
	}
	return ""
}

// Result is the outcome of one Allow call. Each budget's part is zero when that
// budget does not apply (its Limit is then 0).
type Result struct {
	// Allowed reports whether the request passed every budget.
	Allowed bool
	// RefusedAt is the budget that refused the request; StageNone if none did.
	RefusedAt Stage
	// RefusedIn is the span of the window that refused it: the key's (StageKey), or
	// Minute, the org's (StageOrg). Of several of the key's windows refusing it, it is
	// the one a retry waits for longest: one whose whole limit is below the request's
	// cost, else the longest.
	RefusedIn Span
	// NeverFits reports that the request's cost is above the whole limit of the
	// window or month that refused it: no wait lets it through.
	NeverFits bool
	// Key is the key's minute window; Second, Hour and Day are its other windows.
	Key, Second, Hour, Day Window
	// Org is the org's minute window. Org.Allowed reports whether the request passed
	// it: false when the key's windows refused it first and the org's did not count
	// it. Remaining is then what the window has left without this request.
	Org Window
	// Month is the org's month.
	Month Quota
}

// KeyWindow returns the key's window of span s.
func (r *Result) KeyWindow(s Span) Window { return *r.keyWindow(s) }

func (r *Result) keyWindow(s Span) *Window {
	switch s {
	case Second:
		return &r.Second
	case Hour:
		return &r.Hour
	case Day:
		return &r.Day
	}
	return &r.Key
}

// Quota is the state of an organisation's month after one request.
type Quota struct {
	// Limit is the month's quota.
	Limit int64
	// Used is the requests the month has let through, this one included if it passed
	// every budget: only those count against the quota.
	Used int64
	// Remaining is how many more requests the month lets through; never negative.
	Remaining int64
	// ResetAfter is the whole number of seconds left in the UTC month, rounded up and
	// at least 1.
	ResetAfter int
}

// Refusing returns the window that refused the request: the zero Window for a
// request allowed or refused by its month.
func (r *Result) Refusing() Window {
	switch r.RefusedAt {
	case StageKey:
		return r.KeyWindow(r.RefusedIn)
	case StageOrg:
		return r.Org
	}
	return Window{}
}

// RetryAfter is the seconds until the window that refused the request ends: the
// value of Retry-After. It is 0 for a request allowed, refused by its month, or that
// never fits (NeverFits): no waiting within a window would let those through.
func (r *Result) RetryAfter() int {
	if r.NeverFits {
		return 0
	}
	return r.Refusing().ResetAfter
}

// stageCounts are the counts of one request, the answer of its budgets' stages: the
// stage that refused it (0 for none) and the span of its refusing window, the counts
// of the key's windows by span, the org's minute count and the month's count, each
// after this request if it was counted there, else as it stood.
type stageCounts struct {
	stage      int64
	span       Span
	key        [spans]int64
	org, month int64
}

// newResult builds the Result of counts c for b, counted in windows with resets
// seconds left, by span, in month m.
func newResult(b Budgets, c stageCounts, resets *[spans]int, m month) Result {
	l := b.limits()
	r := Result{RefusedAt: Stage(c.stage), RefusedIn: c.span}
	r.Allowed = r.RefusedAt == StageNone
	for s, limit := range l.key {
		if limit > 0 {
			w := r.keyWindow(Span(s))
			*w = window(c.key[s], limit, resets[s])
			w.Allowed = r.RefusedAt != StageKey
		}
	}
	if b.OrgLimit > 0 {
		r.Org = window(c.org, b.OrgLimit, resets[Minute])
		// Refused by the key's windows, the request did not reach the org's.
		r.Org.Allowed = r.RefusedAt != StageKey && r.RefusedAt != StageOrg
	}
	if b.MonthLimit > 0 {
		r.Month = Quota{Limit: b.MonthLimit, Used: c.month, Remaining: max(b.MonthLimit-c.month, 0), ResetAfter: m.resetAfter}
	}
	switch r.RefusedAt {
	case StageKey, StageOrg:
		r.NeverFits = b.cost() > int64(r.Refusing().Limit)
	case StageMonth:
		r.NeverFits = b.cost() > b.MonthLimit
	}
	return r
}

// month is the UTC calendar month holding an instant.
type month struct {
	start      time.Time // its first instant
	name       int       // yyyymm
	resetAfter int       // whole seconds left in it, rounded up, at least 1
	ttlMs      int64     // how long its counter must live: until a day after its end
}

func monthOf(t time.Time) month {
	u := t.UTC()
	start := time.Date(u.Year(), u.Month(), 1, 0, 0, 0, 0, time.UTC)
	left := start.AddDate(0, 1, 0).Sub(u)
	return month{
		start:      start,
		name:       u.Year()*100 + int(u.Month()),
		resetAfter: max(int((left+time.Second-1)/time.Second), 1),
		ttlMs:      ((left + 24*time.Hour) + time.Millisecond - 1).Milliseconds(),
	}
}

// stages counts one request of cost units through the stages of its budgets of
// limits l, from the counts so far of its key's windows (key, by span), its org's
// minute window (org) and its org's month (month), advancing each where it counts the
// request. A stage lets the request through when its cost fits in what the stage has
// left, in each of its windows, and counts its whole cost there. Otherwise the stage
// refuses it, and no stage after it counts it. A window counts every request that
// reaches it, a refused one too, except one refused while the window still had units
// left: that one counts nothing there, so that it does not spend the units a cheaper
// request may still use. (A window with nothing left refuses every request until it
// ends, so what it counts then changes no answer; a request of cost 1 refused by a
// key's only window always counts, as the minute windows always have.) The month
// counts only what it lets through.
//
// It is the one statement of the stages' rules: Local counts with it, countScript
// does the same in Lua, and Redis reads the script's answer with it.
func stages(key *[spans]int64, org, month *int64, l *limits, cost int64) stageCounts {
	var c stageCounts
	if refused, by := keyStage(key, &l.key, cost); refused {
		c.stage, c.span = int64(StageKey), by
	}
	c.key = *key
	if l.org > 0 {
		if c.stage == 0 && !minuteStage(org, int64(l.org), cost) {
			c.stage, c.span = int64(StageOrg), Minute
		}
		c.org = *org
	}
	if l.month > 0 {
		if c.stage == 0 { // the month counts only what it lets through
			if *month+cost <= l.month {
				*month += cost
			} else {
				c.stage = int64(StageMonth)
			}
		}
		c.month = *month
	}
	return c
}

// keyStage counts a request of cost units in the windows of a key holding counts, of
// limits (by span; 0 or less for none), as stages says. It reports whether they
// refused the request, and which of them a retry waits for longest (see
// Result.RefusedIn).
func keyStage(counts *[spans]int64, limits *[spans]int, cost int64) (refused bool, by Span) {
	for s, limit := range limits {
		if limit > 0 && cost > int64(limit)-counts[s] {
			if !refused || waitsLonger(Span(s), by, cost, limits) {
				by = Span(s)
			}
			refused = true
		}
	}
	for s, limit := range limits {
		if limit > 0 && (!refused || counts[s] >= int64(limit)) {
			counts[s] += cost
		}
	}
	return refused, by
}

// waitsLonger reports whether a retry of a request of cost refused by the key's
// windows of spans a and b waits longer for a: a never fits (its whole limit is below
// cost) while b may, or both alike and a is the longer.
func waitsLonger(a, b Span, cost int64, limits *[spans]int) bool {
	if never := cost > int64(limits[a]); never != (cost > int64(limits[b])) {
		return never
	}
	return spanSeconds[a] > spanSeconds[b]
}

// minuteStage counts a request of cost units in the org's minute window holding *n
// of limit, as stages says, and reports whether the window lets it through.
func minuteStage(n *int64, limit, cost int64) bool {
	left := limit - *n
	if cost <= left || left <= 0 {
		*n += cost
	}
	return cost <= left
}
