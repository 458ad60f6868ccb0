package keystore

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
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
// keeps at most one reading in flight. A lookup holds the next reading when it
// arrives, and its batch query asks for that reading as the batch is sent. So every
// reading is sent after each lookup that holds it arrived, and is shared by all of
// them. Under load a reading is sent only as a batch goes out, one per batch at most,
// never back to back. A batch sent while a reading is in flight has its reading sent
// when that one answers.
//
// The insert position, unlike pg_current_wal_lsn(), covers a commit made with
// synchronous_commit off whose record is not yet written. A standby that has
// replayed up to a reading's target reflects every commit completed before the
// reading (docs/operations.md, Standbys).
type Fence struct {
	pool    *pgxpool.Pool
	timeout time.Duration

	readings atomic.Uint64 // sent so far, for tests through export_test.go

	mu      sync.Mutex
	sending bool     // a reading is in flight
	next    *reading // the reading that lookups arriving now hold; nil: none yet
	asked   bool     // next is to be sent as soon as the reading in flight answers
}

// reading is one query of the primary's insert position.
type reading struct {
	fence *Fence
	done  chan struct{} // closed when lsn and err are set
	sent  time.Time     // when the query was sent; zero until then (guarded by fence.mu)
	lsn   LSN           // the fenceTarget of the position read
	err   error
}

// newFence returns a Fence reading the primary through pool, each query bounded by
// timeout.
func newFence(pool *pgxpool.Pool, timeout time.Duration) *Fence {
	return &Fence{pool: pool, timeout: timeout}
}

// hold returns the next reading, to be sent after the call.
func (f *Fence) hold() *reading {
	f.mu.Lock()
	r := f.next
	if r == nil {
		r = &reading{fence: f, done: make(chan struct{})}
		f.next = r
	}
	f.mu.Unlock()
	return r
}

// send asks for r to be sent: now if no reading is in flight, else as soon as the one
// in flight answers. A reading already sent stays as it is.
func (r *reading) send() {
	f := r.fence
	f.mu.Lock()
	defer f.mu.Unlock()
	if !r.sent.IsZero() {
		return
	}
	if f.sending {
		f.asked = true // r is f.next: a reading not sent is the next one
		return
	}
	f.sending = true
	f.next = nil
	r.sent = time.Now()
	go f.read(r)
}

// wait returns the first reading sent after the call, and when it was sent. It stops
// when ctx ends or deadline passes (zero: none).
func (f *Fence) wait(ctx context.Context, deadline time.Time) (LSN, time.Time, error) {
	r := f.hold()
	r.send()
	return r.await(ctx, deadline)
}

// await returns r's position and when r was sent, once it has answered. It stops when
// ctx ends or deadline passes (zero: none). r must have been sent (send).
func (r *reading) await(ctx context.Context, deadline time.Time) (LSN, time.Time, error) {
	select {
	case <-r.done:
		return r.lsn, r.sent, r.err
	default:
	}
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

// read sends r, then the next reading while one was asked for meanwhile, one at a
// time. A reading that fails is tried once more, as a lookup is (retryable): after a
// restart of the primary, the pool's idle connections fail their first query.
func (f *Fence) read(r *reading) {
	for {
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		var insert int64
		f.readings.Add(1)
		err := f.pool.QueryRow(ctx, insertSQL).Scan(&insert)
		if retryable(ctx, err) {
			err = f.pool.QueryRow(ctx, insertSQL).Scan(&insert)
		}
		cancel()
		if err != nil {
			r.err = fmt.Errorf("reading the primary's WAL position: %w", err)
		}
		r.lsn = fenceTarget(LSN(insert))
		close(r.done)
		f.mu.Lock()
		if !f.asked || f.next == nil {
			f.sending = false
			f.mu.Unlock()
			return
		}
		r = f.next
		f.next, f.asked = nil, false
		r.sent = time.Now()
		f.mu.Unlock()
	}
}

// insertSQL reads the primary's WAL insert position. The difference of two pg_lsn
// values is a numeric: the position in bytes.
const insertSQL = `SELECT (pg_current_wal_insert_lsn() - '0/0')::int8`
