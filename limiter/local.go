package limiter

import (
	"context"
	"strings"
	"sync"
	"time"
)

// Local counts in process memory: for a single gateway instance, or when no Redis is
// configured. It keeps only the current window's counts. So its memory is bounded by
// the number of distinct keys seen in one minute.
type Local struct {
	now func() time.Time

	mu     sync.Mutex
	window int64            // guarded by mu
	counts map[string]int64 // guarded by mu; counts of window

	// AllowBudgets's: the orgs' minute counts and months. Allow never reads them.
	seeds     *seeder          // WithMonthSeed's; nil for none
	orgWindow int64            // guarded by mu
	orgs      map[string]int64 // guarded by mu; org minute counts of orgWindow
	month     int64            // guarded by mu; yyyymm
	used      map[string]int64 // guarded by mu; org month counts of month
}

var _ Limiter = (*Local)(nil)

// NewLocal returns an in-process limiter. WithPrefix does not apply to it.
func NewLocal(opts ...Option) *Local {
	o := buildOptions(opts)
	return &Local{now: o.now, counts: make(map[string]int64), seeds: newSeeder(o.monthSeed)}
}

// Allow counts one request of key; see Limiter. Its only error is ErrBadLimit.
func (l *Local) Allow(_ context.Context, key string, limit int) (Result, error) {
	if limit <= 0 {
		return Result{}, ErrBadLimit
	}
	w, reset, _ := windowOf(l.now())

	l.mu.Lock()
	if w > l.window {
		// A new window: forget the old one whole (a new map, so its memory goes too).
		l.window = w
		l.counts = make(map[string]int64, len(l.counts))
	}
	// A clock that steps back counts into the newest window seen. That errs on the
	// side of refusing.
	n, seen := l.counts[key]
	n++
	if seen {
		l.counts[key] = n
	} else {
		// key often shares the memory of a whole request header: keep only its bytes.
		l.counts[strings.Clone(key)] = n
	}
	l.mu.Unlock()

	return result(n, limit, reset), nil
}

// Len returns the number of counters l holds: the keys seen in the current window.
func (l *Local) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.counts)
}
