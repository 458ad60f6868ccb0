package keystore

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/pgfailover"
)

// Defaults of LastUsedOptions.
const (
	DefaultLastUsedInterval   = time.Minute
	DefaultLastUsedMaxPending = 100_000
	maxLastUsedTimeout        = 10 * time.Second
)

// LastUsedOptions tune a LastUsed. The zero value takes every default.
type LastUsedOptions struct {
	// Interval is the time between two flushes, and so the most a key's last_used_at
	// lags its last use. Default: DefaultLastUsedInterval (1m)
	Interval time.Duration
	// Timeout bounds one flush. Default: Interval, at most 10s
	Timeout time.Duration
	// MaxPending caps the key ids remembered between two flushes. The ids of further
	// keys are dropped until the next flush. Default: DefaultLastUsedMaxPending
	MaxPending int
	// OnFlush, if set, is called after every flush that had ids to write, with their
	// number and the flush's error. It runs on the flushing goroutine.
	OnFlush func(ids int, err error)
	// OnDrop, if set, is called for every id Record drops because MaxPending ids are
	// already waiting. It runs on Record's caller, so it must be quick.
	OnDrop func()
}

// LastUsed records which keys were used, and writes when, their last_used_at, in
// batches, off the request path. Record only notes a key id in memory. Run flushes the
// noted ids every Interval, with one statement. A key is written at most once per
// Interval, with the database's clock at the flush. What was noted since the last
// flush is lost if the process dies (docs/operations.md, last_used_at). A flush that
// fails keeps its ids for the next one, as far as MaxPending allows.
//
// A nil *LastUsed records nothing. A LastUsed is safe for concurrent use.
type LastUsed struct {
	pool    *pgxpool.Pool
	opts    LastUsedOptions
	flusher flusher

	mu      sync.Mutex
	pending map[string]struct{}
}

// NewLastUsed returns a LastUsed writing through pool. Start it with Run.
func NewLastUsed(pool *pgxpool.Pool, opts LastUsedOptions) *LastUsed {
	if opts.MaxPending <= 0 {
		opts.MaxPending = DefaultLastUsedMaxPending
	}
	l := &LastUsed{pool: pool, opts: opts, pending: make(map[string]struct{})}
	l.flusher = newFlusher(l.Flush, opts.Interval, opts.Timeout, DefaultLastUsedInterval, maxLastUsedTimeout)
	l.flusher.stopCuts = true
	return l
}

// Record notes that the key keyID was used. It never waits on the database. It takes a
// mutex held only for a map lookup. It allocates only the first time it notes a key id
// between two flushes.
func (l *LastUsed) Record(keyID string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	if _, ok := l.pending[keyID]; ok {
		l.mu.Unlock()
		return
	}
	if len(l.pending) >= l.opts.MaxPending {
		l.mu.Unlock()
		if l.opts.OnDrop != nil {
			l.opts.OnDrop()
		}
		return
	}
	// keyID may share the memory of a request's header: keep a copy of its own.
	l.pending[strings.Clone(keyID)] = struct{}{}
	l.mu.Unlock()
}

// Run flushes every Interval until ctx ends, then flushes once more, within Timeout,
// and returns. A stop cuts a flush in progress short; its ids are written by the last
// (flusher).
func (l *LastUsed) Run(ctx context.Context) { l.flusher.run(ctx) }

// lastUsedSQL sets when the keys among $1 that exist were last used to the flush's
// time, in api_key_last_used: a table of its own, so that the pages of api_keys that
// the lookups read stay unchanged (docs/scaling.md, What a lookup reads). The time
// never goes back: a slower gateway's older flush does not undo a newer one. The rows
// go in key order, the order in which another gateway's flush locks them too.
const lastUsedSQL = `INSERT INTO api_key_last_used AS u (key_id, last_used_at)
SELECT key_id, now() FROM api_keys WHERE key_id = ANY($1) ORDER BY key_id
ON CONFLICT (key_id) DO UPDATE SET last_used_at = excluded.last_used_at
WHERE u.last_used_at < excluded.last_used_at`

// Flush writes the ids noted since the last flush with one statement, and forgets
// them. If it fails they are noted again, for the next flush.
func (l *LastUsed) Flush(ctx context.Context) error {
	l.mu.Lock()
	if len(l.pending) == 0 {
		l.mu.Unlock()
		return nil
	}
	batch := l.pending
	l.pending = make(map[string]struct{}, len(batch))
	l.mu.Unlock()

	ids := make([]string, 0, len(batch))
	for id := range batch {
		ids = append(ids, id)
	}
	_, err := pgfailover.Exec(ctx, l.pool, pgfailover.Local, lastUsedSQL, ids)
	if err != nil {
		err = fmt.Errorf("writing last_used_at: %w", err)
		l.requeue(ids)
	}
	if l.opts.OnFlush != nil {
		l.opts.OnFlush(len(ids), err)
	}
	return err
}

// requeue notes ids again after a failed flush, as far as MaxPending allows. The
// others count as dropped.
func (l *LastUsed) requeue(ids []string) {
	l.mu.Lock()
	dropped := 0
	for _, id := range ids {
		if len(l.pending) >= l.opts.MaxPending {
			dropped++
			continue
		}
		l.pending[id] = struct{}{}
	}
	l.mu.Unlock()
	for range dropped {
		if l.opts.OnDrop != nil {
			l.opts.OnDrop()
		}
	}
}
