package keystore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// LSN is a position in PostgreSQL's write-ahead log, as a byte offset.
type LSN uint64

// walPageSize is the size of a page of the write-ahead log: PostgreSQL's default
// wal_block_size, which only a build of PostgreSQL can change.
const walPageSize = 8192

// walLongHeader is the size of the longest page header, the one that starts a
// segment. A shorter one starts every other page.
const walLongHeader = 40

// fenceTarget is the position a standby must have replayed to reflect every commit
// the primary had inserted by its insert position insert. At a page's start, the
// insert position lies past the page's header, where no record has begun. A standby
// that replayed everything stops at the page's boundary instead. No record ends
// inside a header, and a record ending on the page after its header was begun on the
// previous page, so a replay at or past the boundary is at or past that record's end.
// So the boundary is the target. Without this, an idle primary whose last record
// filled its page would leave every standby a few bytes behind for good.
func fenceTarget(insert LSN) LSN {
	if off := insert % walPageSize; off <= walLongHeader {
		return insert - off
	}
	return insert
}

// Fence reads the primary's WAL insert position for the lookups on standbys. It
// keeps at most one reading in flight. Every call that arrives while one is in flight
// waits for the next one, sent as soon as the first answers and shared by all of
// them. So a call always gets a reading taken after it arrived, and the primary
// answers one small query per round trip whatever the request rate.
//
// The insert position, unlike pg_current_wal_lsn(), covers a commit made with
// synchronous_commit off whose record is not yet written. A standby that has
// replayed up to a reading's target reflects every commit completed before the
// reading (docs/operations.md, Standbys).
type Fence struct {
	pool    *pgxpool.Pool
	timeout time.Duration

	mu      sync.Mutex
	sending bool     // a reading is in flight
	next    *reading // the reading that calls arriving now wait for; nil: none yet
}

// reading is one query of the primary's insert position.
type reading struct {
	done chan struct{} // closed when lsn and err are set
	sent time.Time     // when the query was sent: after every call waiting for it arrived
	lsn  LSN           // the fenceTarget of the position read
	err  error
}

// newFence returns a Fence reading the primary through pool, each query bounded by
// timeout.
func newFence(pool *pgxpool.Pool, timeout time.Duration) *Fence {
	return &Fence{pool: pool, timeout: timeout}
}

// wait returns the first reading sent after the call, and when it was sent. It stops
// when ctx ends or deadline passes (zero: none).
func (f *Fence) wait(ctx context.Context, deadline time.Time) (LSN, time.Time, error) {
	f.mu.Lock()
	r := f.next
	if r == nil {
		r = &reading{done: make(chan struct{})}
		f.next = r
	}
	if !f.sending {
		f.sending = true
		f.next = nil
		r.sent = time.Now()
		go f.read(r)
	}
	f.mu.Unlock()
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := time.NewTimer(time.Until(deadline))
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-r.done:
		return r.lsn, r.sent, r.err
	case <-ctx.Done():
		return 0, time.Time{}, ctx.Err()
	case <-expired:
		return 0, time.Time{}, context.DeadlineExceeded
	}
}

// read sends r, then every reading that calls began to wait for meanwhile, one at a
// time, until none waits.
func (f *Fence) read(r *reading) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		var insert int64
		// The difference of two pg_lsn values is a numeric: the position in bytes.
		err := f.pool.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::int8`).Scan(&insert)
		cancel()
		if err != nil {
			r.err = fmt.Errorf("reading the primary's WAL position: %w", err)
		}
		r.lsn = fenceTarget(LSN(insert))
		close(r.done)
		f.mu.Lock()
		r = f.next
		if r == nil {
			f.sending = false
			f.mu.Unlock()
			return
		}
		f.next = nil
		r.sent = time.Now()
		f.mu.Unlock()
	}
}
