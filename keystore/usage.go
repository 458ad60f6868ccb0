package keystore

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults of UsageOptions.
const (
	DefaultUsageInterval   = 10 * time.Second
	DefaultUsageMaxPending = 100_000
	maxUsageTimeout        = 10 * time.Second
)

// UsageOptions tune a Usage. The zero value takes every default.
type UsageOptions struct {
	// Interval is the time between two flushes, and so the most a process that dies
	// without warning loses. Default: DefaultUsageInterval (10s)
	Interval time.Duration
	// Timeout bounds one flush. Default: Interval, at most 10s
	Timeout time.Duration
	// MaxPending caps the rows held in memory, a row being a key, a minute, an outcome
	// and a status, and the rows of failed flushes counting. The counts of further
	// rows are dropped. Default: DefaultUsageMaxPending
	MaxPending int
	// OnFlush, if set, is called after every flush that had rows to write, with their
	// number and the flush's error. It runs on the flushing goroutine.
	OnFlush func(rows int, err error)
	// OnDrop, if set, is called for each request Record drops, because MaxPending rows
	// are already held or the request cannot be written, with the number of requests
	// (1). It runs on Record's caller: it must be quick.
	OnDrop func(requests int)
}

// usageKey is a row of the record as Record counts it: the key, the UTC minute (Unix
// seconds), the outcome and the status. The key's org is
// beside, in usageCount: a key belongs to one org.
type usageKey struct {
	keyID   string
	minute  int64
	outcome Outcome
	status  int16
}

// usageCount is a row's org, its count of requests not yet written and their units
// beyond one a request (units = count + extra, as in usage_minutes).
type usageCount struct {
	orgID string
	count int64
	extra int64
}

// Usage counts the requests of each key in memory, per UTC minute, outcome and status,
// and adds the counts to usage_minutes in batches, off the request path (the usage
// record of docs/operations.md). Record only counts; Run flushes every Interval with
// one INSERT, whose rows add up with those of other processes. A flush that fails keeps
// its rows for the next one, within MaxPending rows; beyond, their counts are dropped
// and reported through OnDrop. A write that may or may not have been made is sent
// again under its own id, which PostgreSQL skips if it was: no request counts twice.
// What was counted since the last flush is lost if the process dies; Run flushes once
// more when it is stopped.
//
// A nil *Usage records nothing. A Usage is safe for concurrent use.
type Usage struct {
	pool    *pgxpool.Pool
	opts    UsageOptions
	flusher flusher

	// flushing holds one token: whoever holds it is writing, or reading the record
	// with no flush in flight (MonthUsed). A channel so that a wait can end with its
	// context.
	flushing chan struct{}

	mu       sync.Mutex
	pending  map[usageKey]*usageCount // counted since the last flush took them
	inflight map[usageKey]*usageCount // taken by the flush in progress, or nil
	spare    map[usageKey]*usageCount // empty; the next pending, so its room is reused
	// unsure are the batches whose write may or may not have been made, oldest first,
	// and unsureRows their rows. Only the holder of the flush token changes them.
	unsure     []*usageBatch
	unsureRows int
}

// NewUsage returns a Usage writing through pool. Start it with Run.
func NewUsage(pool *pgxpool.Pool, opts UsageOptions) *Usage {
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultUsageMaxPending
	}
	u := &Usage{
		pool:     pool,
		opts:     opts,
		flushing: make(chan struct{}, 1),
		pending:  make(map[usageKey]*usageCount),
		spare:    make(map[usageKey]*usageCount),
	}
	u.flusher = newFlusher(u.Flush, opts.Interval, opts.Timeout, DefaultUsageInterval, maxUsageTimeout)
	return u
}

// Record counts one request of the key keyID of the org orgID, made at at, decided
// with outcome, answered with status and weighing units, its route's cost (below 1
// counts as 1). It never waits on the database: it takes a mutex held for one map
// update, and allocates only for the first request of a row between two flushes.
//
// A request that cannot be written is dropped and reported through OnDrop, so that it
// never fails the flush of the others: an outcome the record does not hold (one
// decided before the key was known, or no outcome at all), a status outside 100..599,
// an org id that is not a UUID or a key id that is not one.
func (u *Usage) Record(orgID, keyID string, at time.Time, outcome Outcome, status int, units int) {
	if u == nil {
		return
	}
	extra := int64(max(units, 1) - 1)
	if !outcome.Recorded() || status < 100 || status > 599 {
		u.drop(1)
		return
	}
	k := usageKey{keyID: keyID, minute: unixMinute(at), outcome: outcome, status: int16(status)}
	u.mu.Lock()
	if c, ok := u.pending[k]; ok {
		c.count++
		c.extra += extra
		u.mu.Unlock()
		return
	}
	if u.held() >= u.opts.MaxPending || !ValidKeyID(keyID) || !validUUID(orgID) {
		u.mu.Unlock()
		u.drop(1)
		return
	}
	// The ids may share the memory of a request: keep copies of their own. The org id
	// in lower case sorts as PostgreSQL sorts the uuid (newUsageBatch).
	k.keyID = strings.Clone(keyID)
	u.pending[k] = &usageCount{orgID: strings.Clone(strings.ToLower(orgID)), count: 1, extra: extra}
	u.mu.Unlock()
}

// drop reports requests dropped.
func (u *Usage) drop(requests int) {
	if requests > 0 && u.opts.OnDrop != nil {
		u.opts.OnDrop(requests)
	}
}

// unixMinute returns the start of the UTC minute of t, in Unix seconds.
func unixMinute(t time.Time) int64 {
	s := t.Unix()
	return s - (s%60+60)%60
}

// validUUID reports whether s is a UUID in its 36-character text form.
func validUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case i == 8 || i == 13 || i == 18 || i == 23:
			if c != '-' {
				return false
			}
		case !isDigit(c) && !('a' <= c && c <= 'f') && !('A' <= c && c <= 'F'):
			return false
		}
	}
	return true
}

// Run flushes every Interval until ctx ends, then flushes once more and returns. Each
// flush, the last one included, runs to its end or its Timeout, whatever becomes of
// ctx, so that a stop never cuts the last writes short (flusher).
func (u *Usage) Run(ctx context.Context) { u.flusher.run(ctx) }
