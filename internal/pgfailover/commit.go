package pgfailover

import (
	"context"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Commit is how a write commits where the operator runs a synchronous standby
// (synchronous_standby_names; docs/operations.md, Failover). A write that takes access
// away is Synced: once acknowledged, it is on the standby, and a failover to it
// cannot undo it. Every other write is Local: it waits on no standby. So a standby
// that stops confirming holds up the writes that take access away, which then fail
// at their timeout, and nothing else. Without a synchronous standby both commit
// alike.
//
// The level is set for the write's own transaction (SET LOCAL), never for a session,
// so that it holds through PgBouncer in transaction pooling and whatever the server,
// database or role default says.
type Commit uint8

const (
	// Local commits with synchronous_commit = local: once the primary has flushed
	// the write. For writes that take no access away: keys created, usage, last
	// used, sessions, the login throttle, monitors, webhooks' and the usage export's
	// bookkeeping, the audit trail of all these.
	Local Commit = iota
	// Synced commits with synchronous_commit = on: with a synchronous standby, once
	// the standby has flushed the write as well, and every write committed before it.
	// For writes that take access away: a key revoked, reported leaked or rolled (its
	// end of grace), revocations replayed after a restore, a plan or an organisation
	// left without API access, a key's scopes or networks narrowed. It waits even
	// when it changes nothing (beginSQL).
	Synced
)

// The statements that set a transaction's level, by Commit. A transaction's is
// set in its BEGIN, sent as one simple query. A single statement's is set by a
// set_config that goes before it in the same pipeline: its implicit transaction
// lasts until the pipeline's end. SET LOCAL there would warn, outside a
// transaction block.
//
// A Synced transaction also writes a record of its own to the WAL (a logical
// decoding message, prefix keygate, which any role may write at any wal_level), so
// that it waits for the standby even when it changes nothing: PostgreSQL waits only
// for a transaction that wrote WAL. A revocation whose wait was cancelled is
// committed on the primary alone: PostgreSQL ends a cancelled wait so, with a
// warning, and pgx sends that cancel when it gives up on a query. Revoking the key
// again finds nothing to change, and must still not be acknowledged before the
// standby has the first revocation; its own record, later in the WAL, makes it wait
// for it.
var (
	beginSQL = [...]string{
		Local:  "BEGIN; SET LOCAL synchronous_commit = local",
		Synced: "BEGIN; SET LOCAL synchronous_commit = on; SELECT " + syncedRecord,
	}
	setSQL = [...]string{
		Local:  "SELECT set_config('synchronous_commit', 'local', true)",
		Synced: "SELECT set_config('synchronous_commit', 'on', true), " + syncedRecord,
	}
)

// syncedRecord writes a Synced transaction's record of its own.
const syncedRecord = "pg_logical_emit_message(true, 'keygate', 'synced')"

// syncSQL raises a transaction's level to Synced.
const syncSQL = "SET LOCAL synchronous_commit = on; SELECT " + syncedRecord

// Beginner begins transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Sender sends pipelines of statements: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Sender interface {
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Begin begins a transaction on db that commits as c.
func Begin(ctx context.Context, db Beginner, c Commit) (pgx.Tx, error) {
	return db.BeginTx(ctx, pgx.TxOptions{BeginQuery: beginSQL[c]})
}

// Sync has tx, begun Local, commit Synced: for a write that finds out only within
// its transaction that it takes access away. It must come before the commit.
func Sync(ctx context.Context, tx pgx.Tx) error {
	_, err := tx.Exec(ctx, syncSQL)
	return err
}

// Exec runs one statement on db that commits as c, in one round trip, and returns
// its command tag.
func Exec(ctx context.Context, db Sender, c Commit, sql string, args ...any) (pgconn.CommandTag, error) {
	br := db.SendBatch(ctx, batch(c, sql, args))
	_, err := br.Exec()
	var tag pgconn.CommandTag
	if err == nil {
		tag, err = br.Exec()
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

// QueryRow runs one statement on db that commits as c and returns at most one row,
// as pgx's QueryRow does: the row's Scan returns the statement's error, or the
// commit's, or pgx.ErrNoRows.
func QueryRow(ctx context.Context, db Sender, c Commit, sql string, args ...any) pgx.Row {
	return batchRow{db.SendBatch(ctx, batch(c, sql, args))}
}

// Query runs one statement on db that commits as c and returns its rows, as pgx's
// Query does. The rows' Err, once Next has returned false or Close has run, is the
// statement's error or the commit's.
func Query(ctx context.Context, db Sender, c Commit, sql string, args ...any) (pgx.Rows, error) {
	br := db.SendBatch(ctx, batch(c, sql, args))
	_, err := br.Exec()
	var rows pgx.Rows
	if err == nil {
		rows, err = br.Query()
	}
	if err != nil {
		br.Close()
		return nil, err
	}
	return &batchRows{Rows: rows, br: br}, nil
}

// NewBatch returns a pipeline whose statements commit as c, in one implicit
// transaction: its first statement sets the level. The results of the statements
// the caller queues come after that one's.
func NewBatch(c Commit) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(setSQL[c])
	return b
}

// batch is the pipeline of one statement that commits as c.
func batch(c Commit, sql string, args []any) *pgx.Batch {
	b := NewBatch(c)
	b.Queue(sql, args...)
	return b
}

// batchRow is the row of QueryRow.
type batchRow struct{ br pgx.BatchResults }

func (r batchRow) Scan(dest ...any) error {
	_, err := r.br.Exec()
	if err == nil {
		err = r.br.QueryRow().Scan(dest...)
	}
	if cerr := r.br.Close(); err == nil {
		err = cerr
	}
	return err
}

// batchRows are the rows of Query. Their end closes the pipeline, whose end is
// the commit.
type batchRows struct {
	pgx.Rows
	br     pgx.BatchResults
	closed bool
	err    error // the pipeline's, once closed
}

func (r *batchRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *batchRows) Close() {
	if r.closed {
		return
	}
	r.closed = true
	r.Rows.Close()
	r.err = r.br.Close()
}

func (r *batchRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}
