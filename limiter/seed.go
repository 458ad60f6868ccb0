package limiter

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
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
// error is Allow's, and nothing is counted; the next count calls again.
// Default: a missing month starts at zero.
func WithMonthSeed(seed MonthSeed) Option {
	return func(o *options) { o.monthSeed = seed }
}

// ErrMonthSeed is wrapped by the error of an Allow whose month's seed failed
// or did not answer in time (see WithMonthSeed). The counter's own store answered: a
// caller that tracks the store's health does not count it against it.
var ErrMonthSeed = errors.New("limiter: the month's count could not be read from its record")

// errMonthMissing: the month's counter was missing and no seed was given, so nothing
// was counted; the caller seeds the month and counts again.
var errMonthMissing = errors.New("limiter: the month's counter is missing")

// seedAttempts is how many times Allow counts: once, and once more with a seed
// if the month was missing. A count with a seed sets a missing month, so the second
// cannot find it missing.
const seedAttempts = 2

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
