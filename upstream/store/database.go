package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultDatabaseTimeout bounds each wait on PostgreSQL (a pool acquire, a statement, a
// batch) when serve's --database-timeout is not given.
const DefaultDatabaseTimeout = 5 * time.Second

// DefaultMaxConns is the pool size when DATABASE_URL has no pool_max_conns. pgxpool's
// own default, max(4, NumCPU), queues dashboard requests behind four slow statements on
// a small machine; 16 connections stay far below PostgreSQL's default max_connections
// (100) even with a few upstream instances.
const DefaultMaxConns = 16

// defaultMinConns is the floor of connections the pool keeps open when DATABASE_URL
// has no pool_min_conns, so that requests after a quiet spell, or after PostgreSQL
// restarted behind a slow link, find connections ready rather than wait for one to
// open (pgxpool opens them in the background, within ConnectTimeout).
const defaultMinConns = 4

// PoolConfig parses databaseURL into a pool configuration whose every wait on the
// database is bounded by timeout (see timeoutTracer). maxConns, when positive, sets the
// pool size; otherwise pool_max_conns of the URL does, or DefaultMaxConns.
func PoolConfig(databaseURL string, maxConns int32, timeout time.Duration) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, err
	}
	switch {
	case maxConns > 0:
		cfg.MaxConns = maxConns
	case !strings.Contains(databaseURL, "pool_max_conns"):
		cfg.MaxConns = DefaultMaxConns
	}
	if !strings.Contains(databaseURL, "pool_min_conns") {
		cfg.MinConns = min(defaultMinConns, cfg.MaxConns)
	}
	if timeout > 0 {
		if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > timeout {
			cfg.ConnConfig.ConnectTimeout = timeout
		}
		cfg.ConnConfig.Tracer = timeoutTracer{timeout: timeout}
	}
	return cfg, nil
}

// timeoutTracer bounds every wait of a pool on PostgreSQL: pgx and pgxpool run the
// acquire, each statement and each batch under the context a tracer's Start method
// returns, and call its End method when the wait is over. Applying the timeout here,
// once, covers every query of the upstream and of the keystore it shares the pool
// with, without a deadline at each call site. A statement or acquire that outlives the
// timeout fails with context.DeadlineExceeded, which apperr.Code maps to EUNAVAILABLE
// (503). Each wait gets the whole timeout: a request making several queries that each
// answer in time never fails for their sum.
type timeoutTracer struct {
	timeout time.Duration
}

type cancelKey struct{}

// start derives the bounded context of one wait, carrying its cancel function for end.
func (t timeoutTracer) start(ctx context.Context) context.Context {
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	return context.WithValue(ctx, cancelKey{}, cancel)
}

// end releases the timer of the wait that start began.
func (t timeoutTracer) end(ctx context.Context) {
	if cancel, ok := ctx.Value(cancelKey{}).(context.CancelFunc); ok {
		cancel()
	}
}

func (t timeoutTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return t.start(ctx)
}

func (t timeoutTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	t.end(ctx)
}

func (t timeoutTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return t.start(ctx)
}

func (t timeoutTracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (t timeoutTracer) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	t.end(ctx)
}

func (t timeoutTracer) TraceAcquireStart(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireStartData) context.Context {
	return t.start(ctx)
}

func (t timeoutTracer) TraceAcquireEnd(ctx context.Context, _ *pgxpool.Pool, _ pgxpool.TraceAcquireEndData) {
	t.end(ctx)
}

// Open opens a pool configured by cfg (from PoolConfig) and pings it.
func Open(ctx context.Context, cfg *pgxpool.Config) (*pgxpool.Pool, error) {
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("connecting to postgres: %w", err)
	}
	return pool, nil
}

// Interface guards
var (
	_ pgx.QueryTracer       = timeoutTracer{}
	_ pgx.BatchTracer       = timeoutTracer{}
	_ pgxpool.AcquireTracer = timeoutTracer{}
)
