package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/keygate/keygate/internal/gather"
)

// Budgets are the budgets one request counts against, in the order AllowBudgets counts
// them: its key's minute, its organisation's minute, its organisation's UTC calendar
// month. A budget applies when its limit is positive; zero or less means none.
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
}

// orgWide reports whether b has a budget of its organisation's.
func (b Budgets) orgWide() bool { return b.OrgLimit > 0 || b.MonthLimit > 0 }

func (b Budgets) check() error {
	if b.KeyLimit <= 0 && !b.orgWide() {
		return ErrBadLimit
	}
	if b.orgWide() && b.Org == "" {
		return ErrNoOrg
	}
	return nil
}

// ErrNoOrg is returned by AllowBudgets for an organisation's budget without an
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

// BudgetsResult is the outcome of one AllowBudgets call. Each budget's part is zero
// when that budget does not apply (its Limit is then 0).
type BudgetsResult struct {
	// Allowed reports whether the request passed every budget.
	Allowed bool
	// RefusedAt is the budget that refused the request; StageNone if none did.
	RefusedAt Stage
	// Key is the key's minute window, as Allow reports it.
	Key Result
	// Org is the org's minute window. Org.Allowed reports whether the request passed
	// it: false when the key's minute refused it first and the org's did not count it.
	// Remaining is then what the window has left without this request.
	Org Result
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
func (r BudgetsResult) RetryAfter() int {
	switch r.RefusedAt {
	case StageKey:
		return r.Key.ResetAfter
	case StageOrg:
		return r.Org.ResetAfter
	}
	return 0
}

// BudgetLimiter is what both backends do for a request with budgets beyond its key's
// minute.
type BudgetLimiter interface {
	Limiter
	// AllowBudgets counts one request against b's budgets in order, stopping at the
	// first that refuses it: the key's minute window counts it as Allow does; then,
	// if the key's allowed it, the org's minute window counts it; then, if that
	// allowed it, the org's month lets it through and counts it, or refuses it
	// uncounted once Used has reached MonthLimit. Minute windows count every request
	// that reaches them, refused or not; a month counts only what passed every
	// budget. A Budgets with neither org budget is exactly Allow of its key (the same
	// counter). An error means nothing was counted, as for Allow.
	AllowBudgets(ctx context.Context, b Budgets) (BudgetsResult, error)
}

var (
	_ BudgetLimiter = (*Redis)(nil)
	_ BudgetLimiter = (*Local)(nil)
)

// MonthSeed returns how many requests org has had through in the UTC month that starts
// at month, from a record that outlives the limiter's counters (a database): the
// count a month starts from when its counter is missing (see WithMonthSeed).
type MonthSeed func(ctx context.Context, org string, month time.Time) (used int64, err error)

// WithMonthSeed makes a month whose counter is missing start from seed's count rather
// than from zero: a Redis that restarted or lost its data (or an instance that
// started) does not give an org a fresh month. The counter is missing at the start of
// every month, so seed is called then too. The callers needing the same org's month
// share one seed call, each waiting for it until its own deadline, and so do the
// counts that found the month missing just after its answer came (see seeder.seed).
// The call serves them all, so it runs under none of their deadlines or cancellations
// (its context keeps the first caller's values): seed must bound its own time. Its
// error is AllowBudgets's, and nothing is counted; the next count calls again.
// Default: a missing month starts at zero.
func WithMonthSeed(seed MonthSeed) Option {
	return func(o *options) { o.monthSeed = seed }
}

// ErrMonthSeed is wrapped by the error of an AllowBudgets whose month's seed failed
// or did not answer in time (see WithMonthSeed). The counter's own store answered: a
// caller that tracks the store's health does not count it against it.
var ErrMonthSeed = errors.New("limiter: the month's count could not be read from its record")

// errMonthMissing: the month's counter was missing and no seed was given, so nothing
// was counted; the caller seeds the month and counts again.
var errMonthMissing = errors.New("limiter: the month's counter is missing")

// seedAttempts is how many times AllowBudgets counts: once, and once more with a seed
// if the month was missing. A count with a seed sets a missing month, so the second
// cannot find it missing.
const seedAttempts = 2

// budgetCounts are the counts of one request, the answer of its budgets' stages: the
// stage that refused it (0 for none), the key's minute count, the org's minute count
// and the month's count, each after this request if it was counted there, else as it
// stood.
type budgetCounts struct {
	stage, key, org, month int64
}

// budgetsResult builds the BudgetsResult of counts for b, counted in a minute window
// with resetAfter seconds left, in month m.
func budgetsResult(b Budgets, c budgetCounts, resetAfter int, m month) BudgetsResult {
	r := BudgetsResult{RefusedAt: Stage(c.stage)}
	r.Allowed = r.RefusedAt == StageNone
	if b.KeyLimit > 0 {
		r.Key = result(c.key, b.KeyLimit, resetAfter)
	}
	if b.OrgLimit > 0 {
		r.Org = result(c.org, b.OrgLimit, resetAfter)
		if r.RefusedAt == StageKey {
			r.Org.Allowed = false // not counted: c.org is the count without it
		}
	}
	if b.MonthLimit > 0 {
		r.Month = Quota{Limit: b.MonthLimit, Used: c.month, Remaining: max(b.MonthLimit-c.month, 0), ResetAfter: m.resetAfter}
	}
	return r
}

// keyOnly is the BudgetsResult of a request counted by Allow alone.
func keyOnly(r Result) BudgetsResult {
	br := BudgetsResult{Allowed: r.Allowed, Key: r}
	if !r.Allowed {
		br.RefusedAt = StageKey
	}
	return br
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

// seeder runs a MonthSeed once at a time per org and month, and shares each answer
// with the counts that found the month missing before a count applied it.
type seeder struct {
	fn MonthSeed

	mu    sync.Mutex
	calls map[seedKey]*seedCall // guarded by mu; calls in flight, and answered of late
}

type seedKey struct {
	org   string
	month int64 // Unix seconds of its start
}

// seedCall is one call of a seeder's MonthSeed.
type seedCall struct {
	done     chan struct{} // closed when used and err are set
	used     int64
	err      error
	answered time.Time // guarded by seeder.mu; when done was closed, zero before
	applied  time.Time // guarded by seeder.mu; when a count first counted with used
}

// seedShared is how long a seed call's answer serves the counts that come back for it
// (see seed).
const seedShared = time.Second

// newSeeder returns a seeder running fn, or nil for none.
func newSeeder(fn MonthSeed) *seeder {
	if fn == nil {
		return nil
	}
	return &seeder{fn: fn, calls: make(map[seedKey]*seedCall)}
}

// seed returns the call answering org's count of the month starting at start, for a
// count sent at sent that found the month missing: the call in flight for them, or
// one answered within seedShared that no count had applied when this count was sent,
// or else a new call. It waits for the call's answer until ctx ends or deadline
// (zero: none) passes. A count that then counts with the answer calls applied.
//
// The counts that find a month missing come in bursts: at the month's start, or after
// Redis lost its data, every count sent before the first count with a seed has set
// the month finds it missing, and many come back after the first call is over. They
// found the month missing for the same reason as the call's first caller, so its
// answer is theirs too. A count sent after the answer was applied, and finding the
// month missing, has seen it go missing again: it calls anew.
func (s *seeder) seed(ctx context.Context, deadline, sent time.Time, org string, start time.Time) (*seedCall, error) {
	k := seedKey{org: org, month: start.Unix()}
	s.mu.Lock()
	c, ok := s.calls[k]
	if !ok || !c.answered.IsZero() && (time.Since(c.answered) > seedShared || !c.applied.IsZero() && !sent.Before(c.applied)) {
		k.org = strings.Clone(org) // org may share a request's memory
		c = &seedCall{done: make(chan struct{})}
		s.calls[k] = c
		go s.run(context.WithoutCancel(ctx), k, c, start)
	}
	s.mu.Unlock()
	ctx, cancel := bounded(ctx, deadline)
	defer cancel()
	select {
	case <-c.done:
		return c, c.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// applied records that a count has counted with c's answer: the month is set, and
// counts sent from now on that find it missing call anew.
func (s *seeder) applied(c *seedCall) {
	s.mu.Lock()
	if c.applied.IsZero() {
		c.applied = time.Now()
	}
	s.mu.Unlock()
}

// run makes seed call c for k, whose month starts at start. A failed call is forgotten
// at once, so that the next count calls again; an answer, once it no longer serves.
func (s *seeder) run(ctx context.Context, k seedKey, c *seedCall, start time.Time) {
	c.used, c.err = s.fn(ctx, k.org, start)
	if c.err == nil && c.used < 0 {
		c.err = fmt.Errorf("month seed returned %d", c.used)
	}
	forget := func() {
		s.mu.Lock()
		if s.calls[k] == c {
			delete(s.calls, k)
		}
		s.mu.Unlock()
	}
	s.mu.Lock()
	c.answered = time.Now()
	s.mu.Unlock()
	close(c.done)
	if c.err != nil {
		forget()
		return
	}
	time.AfterFunc(seedShared, forget)
}

// firstSeed is the seed a count first goes with: -1 (a missing month stops the count,
// to be seeded) with a seeder, 0 (a missing month starts at zero) without.
func firstSeed(s *seeder) int64 {
	if s != nil {
		return -1
	}
	return 0
}

// AllowBudgets counts one request against b's budgets; see BudgetLimiter. Its errors
// are ErrBadLimit and ErrNoOrg for bad budgets, and WithMonthSeed's.
func (l *Local) AllowBudgets(ctx context.Context, b Budgets) (BudgetsResult, error) {
	if err := b.check(); err != nil {
		return BudgetsResult{}, err
	}
	if !b.orgWide() {
		r, err := l.Allow(ctx, b.Key, b.KeyLimit)
		return keyOnly(r), err
	}
	t := l.now()
	w, reset, _ := windowOf(t)
	m := monthOf(t)
	seed := firstSeed(l.seeds)
	var call *seedCall // the seed call seed came from
	for range seedAttempts {
		sent := time.Now()
		l.mu.Lock()
		c, ok := l.countBudgets(b, w, m, seed)
		l.mu.Unlock()
		if ok {
			if call != nil {
				l.seeds.applied(call)
			}
			return budgetsResult(b, c, reset, m), nil
		}
		var err error
		if call, err = l.seeds.seed(ctx, gather.Deadline(ctx, 0), sent, b.Org, m.start); err != nil {
			return BudgetsResult{}, fmt.Errorf("seeding the month of org %s: %w: %w", b.Org, ErrMonthSeed, err)
		}
		seed = call.used
	}
	return BudgetsResult{}, fmt.Errorf("seeding the month of org %s: %w", b.Org, errMonthMissing)
}

// countBudgets counts b's stages in window w and month m, as budgetScript does. It
// counts nothing and returns false when the month is needed, not held, and seed is
// negative. It must be called with mu held.
func (l *Local) countBudgets(b Budgets, w int64, m month, seed int64) (budgetCounts, bool) {
	// As in Allow, a clock that steps back counts into the newest window (and month)
	// seen, which errs on the side of refusing.
	if w > l.window {
		l.window = w
		l.counts = make(map[string]int64, len(l.counts))
	}
	if w > l.orgWindow || l.orgs == nil {
		l.orgWindow = w
		l.orgs = make(map[string]int64, len(l.orgs))
	}
	if int64(m.name) > l.month || l.used == nil {
		l.month = int64(m.name)
		l.used = make(map[string]int64, len(l.used))
	}
	used, held := l.used[b.Org]
	if b.MonthLimit > 0 && !held {
		if seed < 0 {
			return budgetCounts{}, false
		}
		used = seed
		l.used[strings.Clone(b.Org)] = used
	}
	key, keySeen := l.counts[b.Key]
	org, orgSeen := l.orgs[b.Org]
	c := stages(&key, &org, &used, b.KeyLimit, b.OrgLimit, b.MonthLimit)
	if b.KeyLimit > 0 {
		store(l.counts, b.Key, key, keySeen)
	}
	if b.OrgLimit > 0 && c.stage != int64(StageKey) {
		store(l.orgs, b.Org, org, orgSeen)
	}
	if b.MonthLimit > 0 {
		l.used[b.Org] = used
	}
	return c, true
}

// stages counts one request through the stages of its budgets, from the counts so far
// of its key's minute window (key), its org's minute window (org) and its org's month
// (month), advancing each where it counts the request. It is the one statement of the
// stages' rules: Local counts with it, budgetScript does the same in Lua, and Redis
// reads the script's answer with it.
func stages(key, org, month *int64, keyLimit, orgLimit int, monthLimit int64) budgetCounts {
	var c budgetCounts
	if keyLimit > 0 {
		*key++ // the key's minute counts every request
		c.key = *key
		if c.key > int64(keyLimit) {
			c.stage = int64(StageKey)
		}
	}
	if orgLimit > 0 {
		if c.stage == 0 { // the org's minute counts what the key's let through
			*org++
			if *org > int64(orgLimit) {
				c.stage = int64(StageOrg)
			}
		}
		c.org = *org
	}
	if monthLimit > 0 {
		if c.stage == 0 { // the month counts only what it lets through
			if *month >= monthLimit {
				c.stage = int64(StageMonth)
			} else {
				*month++
			}
		}
		c.month = *month
	}
	return c
}

// store sets counts[k] to n, keeping a copy of k's bytes only when it is new (seen
// false): k often shares the memory of a whole request header.
func store(counts map[string]int64, k string, n int64, seen bool) {
	if seen {
		counts[k] = n
	} else {
		counts[strings.Clone(k)] = n
	}
}
