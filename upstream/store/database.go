package store

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/pgfailover"
)

// DefaultDatabaseTimeout bounds each wait on PostgreSQL: a pool acquire, a statement, a
// batch. serve's --database-timeout may set another.
const DefaultDatabaseTimeout = 5 * time.Second

// DefaultMaxConns is the pool size when DATABASE_URL has no pool_max_conns. pgxpool's
// own default is max(4, NumCPU). On a small machine, that queues dashboard requests
// behind four slow statements. 16 connections stay far below PostgreSQL's default
// max_connections (100), even with a few upstream instances.
const DefaultMaxConns = 16

// defaultMinConns is the floor of open connections when DATABASE_URL has no
// pool_min_conns. Requests after a quiet spell then find connections ready. So do
// requests after PostgreSQL restarted behind a slow link. pgxpool opens these
// connections in the background, within ConnectTimeout (docs/dependencies.md).
const defaultMinConns = 4

// PoolConfig parses databaseURL into a pool configuration. timeout bounds its every
// wait on the database (timeoutTracer). A positive maxConns sets the pool size.
// Otherwise the URL's pool_max_conns does, or else DefaultMaxConns. The pool follows
// a failover (pgfailover.Follow): it never hands out a connection its server closed.
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
	pgfailover.Follow(cfg)
	if timeout > 0 {
		if cfg.ConnConfig.ConnectTimeout == 0 || cfg.ConnConfig.ConnectTimeout > timeout {
			cfg.ConnConfig.ConnectTimeout = timeout
		}
		cfg.ConnConfig.Tracer = timeoutTracer{timeout: timeout}
	}
	return cfg, nil
}

// timeoutTracer bounds every wait of a pool on PostgreSQL. pgx and pgxpool run the
// acquire, each statement and each batch under the context a tracer's Start method
// returns. They call its End method when the wait is over. The timeout applied here,
// once, covers every query. That includes the keystore's, which shares the pool. No
// call site needs a deadline of its own. A wait that outlives the timeout fails with
// context.DeadlineExceeded, which apperr.Code maps to EUNAVAILABLE (503). Each wait
// gets the whole timeout. So a request never fails for the sum of queries that each
// answer in time.
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

// Open opens a pool configured by cfg, from PoolConfig, and pings it.
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
