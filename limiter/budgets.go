package limiter

import (
	"errors"
	"time"
)

// Budgets are the budgets one request counts against, in the order Allow counts them:
// its key's minute, its organisation's minute, its organisation's UTC calendar month.
// A budget applies when its limit is positive; zero or less means none. A request
// with its key's minute alone is counted on that key's own counter, as it always was;
// one with an organisation budget counts all three on counters of the organisation's
// (see Redis.Allow).
type Budgets struct {
	// Key is the API key's id; KeyLimit its requests per minute window.
	Key      string
	KeyLimit int
	// Org is the organisation's id, needed by the two budgets after the key's.
	Org string
	// OrgLimit is the org's requests per minute window, across all its keys.
	OrgLimit int
	// MonthLimit is the org's requests per UTC calendar month, across all its keys.
	MonthLimit int64
	// Cost is how many units the request weighs at every budget: it passes one only
	// when its whole cost fits in what the budget has left, and counts all of it
	// there; otherwise it is refused whole, counted nowhere from there on. Limits
	// are in units. Default (0): 1.
	Cost int
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
	if b.KeyLimit <= 0 && !b.orgWide() || b.Cost < 0 {
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
	StageKey                // the key's minute
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
	// Key is the key's minute window.
	Key Minute
	// Org is the org's minute window. Org.Allowed reports whether the request passed
	// it: false when the key's minute refused it first and the org's did not count it.
	// Remaining is then what the window has left without this request.
	Org Minute
	// Month is the org's month.
	Month Quota
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

// RetryAfter is the seconds until the minute window that refused the request ends:
// the value of Retry-After. It is 0 for a request allowed or refused by its month,
// which no waiting within the minute would let through.
func (r Result) RetryAfter() int {
	switch r.RefusedAt {
	case StageKey:
		return r.Key.ResetAfter
	case StageOrg:
		return r.Org.ResetAfter
	}
	return 0
}

// stageCounts are the counts of one request, the answer of its budgets' stages: the
// stage that refused it (0 for none), the key's minute count, the org's minute count
// and the month's count, each after this request if it was counted there, else as it
// stood.
type stageCounts struct {
	stage, key, org, month int64
}

// newResult builds the Result of counts c for b, counted in a minute window with
// resetAfter seconds left, in month m.
func newResult(b Budgets, c stageCounts, resetAfter int, m month) Result {
	r := Result{RefusedAt: Stage(c.stage)}
	r.Allowed = r.RefusedAt == StageNone
	if b.KeyLimit > 0 {
		r.Key = minute(c.key, b.KeyLimit, resetAfter)
		r.Key.Allowed = r.RefusedAt != StageKey
	}
	if b.OrgLimit > 0 {
		r.Org = minute(c.org, b.OrgLimit, resetAfter)
		// Refused by the key's minute, the request did not reach the org's.
		r.Org.Allowed = r.RefusedAt != StageKey && r.RefusedAt != StageOrg
	}
	if b.MonthLimit > 0 {
		r.Month = Quota{Limit: b.MonthLimit, Used: c.month, Remaining: max(b.MonthLimit-c.month, 0), ResetAfter: m.resetAfter}
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

// stages counts one request of cost units through the stages of its budgets, from the
// counts so far of its key's minute window (key), its org's minute window (org) and
// its org's month (month), advancing each where it counts the request. A stage lets
// the request through when its cost fits in what the stage has left, and counts its
// whole cost. Otherwise the stage refuses it, and no stage after it counts it. A
// minute window counts every request that reaches it, a refused one too, except one
// refused while the window still had units left: that one counts nothing, so that it
// does not spend the units a cheaper request may still use. (A request of cost 1 is
// refused only once nothing is left, so it always counts, as the minute windows
// always have.) The month counts only what it lets through.
//
// It is the one statement of the stages' rules: Local counts with it, countScript
// does the same in Lua, and Redis reads the script's answer with it.
func stages(key, org, month *int64, keyLimit, orgLimit int, monthLimit int64, cost int64) stageCounts {
	var c stageCounts
	if keyLimit > 0 {
		if !minuteStage(key, int64(keyLimit), cost) {
			c.stage = int64(StageKey)
		}
		c.key = *key
	}
	if orgLimit > 0 {
		if c.stage == 0 && !minuteStage(org, int64(orgLimit), cost) {
			c.stage = int64(StageOrg)
		}
		c.org = *org
	}
	if monthLimit > 0 {
		if c.stage == 0 { // the month counts only what it lets through
			if *month+cost <= monthLimit {
				*month += cost
			} else {
				c.stage = int64(StageMonth)
			}
		}
		c.month = *month
	}
	return c
}

// minuteStage counts a request of cost units in a minute window holding *n of limit,
// as stages says, and reports whether the window lets it through.
func minuteStage(n *int64, limit, cost int64) bool {
	left := limit - *n
	if cost <= left || left <= 0 {
		*n += cost
	}
	return cost <= left
}
