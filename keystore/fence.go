package keystore

import (
	"context"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
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
// time. A run of readings shares one connection of the pool, held until the run ends:
// under load a reading goes out with nearly every batch, and acquiring a connection
// for each cost more than the query. A reading whose connection failed is tried once
// more on another, as a lookup is (retryable).
func (f *Fence) read(r *reading) {
	var conn *pgxpool.Conn
	defer func() {
		if conn != nil {
			conn.Release()
		}
	}()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), f.timeout)
		f.readings.Add(1)
		insert, err := f.query(ctx, &conn)
		if retryable(ctx, err) {
			insert, err = f.query(ctx, &conn)
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

// insertStatement is insertSQL's prepared statement, on the connections that the
// fence has read on.
const insertStatement = "keygate_fence_insert"

// query reads the primary's insert position on *conn, which it first acquires from
// the pool when nil. A query that fails releases *conn and sets it to nil: the pool
// drops a broken connection, and the next query acquires another.
//
// Where the pool prepares statements, the query is insertStatement's, executed on the
// connection itself and its one binary int8 read from the wire. pgx's QueryRow and
// Scan of a row cost the gateway a quarter more CPU a reading (BenchmarkFenceRead).
// In the exec modes that prepare nothing (PgBouncer in transaction pooling) it is a
// plain QueryRow.
func (f *Fence) query(ctx context.Context, conn **pgxpool.Conn) (int64, error) {
	if *conn == nil {
		c, err := f.pool.Acquire(ctx)
		if err != nil {
			return 0, err
		}
		*conn = c
	}
	insert, err := readInsert(ctx, (*conn).Conn())
	if err != nil {
		(*conn).Release()
		*conn = nil
	}
	return insert, err
}

// readInsert reads the insert position on conn (see Fence.query).
func readInsert(ctx context.Context, conn *pgx.Conn) (int64, error) {
	var insert int64
	switch conn.Config().DefaultQueryExecMode {
	case pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe:
	default:
		err := conn.QueryRow(ctx, insertSQL).Scan(&insert)
		return insert, err
	}
	// Prepare is a lookup in the connection's own map once the statement is there.
	if _, err := conn.Prepare(ctx, insertStatement, insertSQL); err != nil {
		return 0, err
	}
	rr := conn.PgConn().ExecPrepared(ctx, insertStatement, nil, nil, binaryResult)
	rows, valid := 0, false
	for rr.NextRow() {
		rows++
		v := rr.Values()
		if valid = len(v) == 1 && len(v[0]) == 8; valid {
			insert = int64(binary.BigEndian.Uint64(v[0]))
		}
	}
	if _, err := rr.Close(); err != nil {
		return 0, err
	}
	if rows != 1 || !valid {
		return 0, fmt.Errorf("%d rows, not one int8", rows)
	}
	return insert, nil
}

// binaryResult asks for a statement's one column in binary: an int8 is then its
// eight bytes, big-endian.
var binaryResult = []int16{pgx.BinaryFormatCode}
