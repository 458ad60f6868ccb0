package limiter

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/keygate/keygate/internal/gather"
)

// Local counts in process memory: for a single gateway instance, or when no Redis is
// configured. It keeps only the current window's counts of each span and the current
// month's. So its memory is bounded by the number of distinct keys and orgs seen in
// one window of each span (a day for keys with a day's limit), and of orgs with a
// monthly quota seen in one month.
type Local struct {
	now   func() time.Time
	seeds *seeder // WithMonthSeed's; nil for none

	mu    sync.Mutex
	keys  [spans]windowCounts // guarded by mu; the keys' counts, by span
	orgs  windowCounts        // guarded by mu; the orgs' minute counts
	month int64               // guarded by mu; yyyymm
	used  map[string]int64    // guarded by mu; the orgs' month counts of month
}

// windowCounts are the counts of one window, by key or org.
type windowCounts struct {
	index  int64
	counts map[string]int64
}

// at returns the counts of window index. A clock that steps back counts into the
// newest window seen, which errs on the side of refusing. A new window forgets the
// old one whole (a new map, so its memory goes too).
func (w *windowCounts) at(index int64) map[string]int64 {
	if index > w.index || w.counts == nil {
		w.index = index
		w.counts = make(map[string]int64, len(w.counts))
	}
	return w.counts
}

// NewLocal returns an in-process limiter. WithPrefix does not apply to it.
func NewLocal(opts ...Option) *Local {
	o := buildOptions(opts)
	return &Local{now: o.now, seeds: newSeeder(o.monthSeed)}
}

// Allow counts one request against b's budgets; see Limiter. Its errors are
// ErrBadLimit and ErrNoOrg for bad budgets, and WithMonthSeed's.
func (l *Local) Allow(ctx context.Context, b Budgets) (Result, error) {
	if err := b.check(); err != nil {
		return Result{}, err
	}
	t := l.now()
	w := clockAt(t)
	var m month
	if b.orgWide() {
		m = monthOf(t)
	}
	seed := firstSeed(l.seeds)
	var call *seedCall // the seed call seed came from
	for range seedAttempts {
		sent := time.Now()
		l.mu.Lock()
		c, ok := l.count(b, &w, m, seed)
		l.mu.Unlock()
		if ok {
			if call != nil {
				l.seeds.applied(call)
			}
			return newResult(b, c, &w.resets, m), nil
		}
		var err error
		if call, err = l.seeds.seed(ctx, gather.Deadline(ctx, 0), sent, b.Org, m.start); err != nil {
			return Result{}, fmt.Errorf("seeding the month of org %s: %w: %w", b.Org, ErrMonthSeed, err)
		}
		seed = call.used
	}
	return Result{}, fmt.Errorf("seeding the month of org %s: %w", b.Org, errMonthMissing)
}

// count counts b's stages in the windows of w and month m, as countScript does. It
// counts nothing and returns false when the month is needed, not held, and seed is
// negative. It must be called with mu held.
func (l *Local) count(b Budgets, w *clock, m month, seed int64) (stageCounts, bool) {
	lim := b.limits()
	var used, org int64
	var usedHeld, orgSeen bool
	var orgs map[string]int64
	if b.orgWide() {
		orgs = l.orgs.at(w.index[Minute])
		if int64(m.name) > l.month || l.used == nil {
			l.month = int64(m.name)
			l.used = make(map[string]int64, len(l.used))
		}
		used, usedHeld = l.used[b.Org]
		if b.MonthLimit > 0 && !usedHeld {
			if seed < 0 {
				return stageCounts{}, false
			}
			used = seed
			l.used[strings.Clone(b.Org)] = used
		}
		org, orgSeen = orgs[b.Org]
	}
	var key [spans]int64
	var keySeen [spans]bool
	var counts [spans]map[string]int64
	for s, limit := range lim.key {
		if limit > 0 {
			counts[s] = l.keys[s].at(w.index[s])
			key[s], keySeen[s] = counts[s][b.Key]
		}
	}
	c := stages(&key, &org, &used, &lim, b.cost())
	for s, limit := range lim.key {
		if limit > 0 {
			store(counts[s], b.Key, key[s], keySeen[s])
		}
	}
	if b.OrgLimit > 0 && c.stage != int64(StageKey) {
		store(orgs, b.Org, org, orgSeen)
	}
	if b.MonthLimit > 0 {
		l.used[b.Org] = used
	}
	return c, true
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

// Len returns the number of minute counters of keys l holds: the keys with a minute's
// limit seen in the current minute.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys[Minute].counts)
}
