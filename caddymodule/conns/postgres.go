package conns

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/keygate/keygate/internal/pgfailover"
	"github.com/keygate/keygate/keystore"
)

// Setup is how a pool opens connections: within DialTimeout, a budget of its own, and
// MinConns of them kept open (database_min_conns, redis_min_conns). See warm.go.
type Setup struct {
	DialTimeout time.Duration
	MinConns    int
}

// Key is Setup as part of a key of the pools that outlive a config reload. A changed
// setting makes a new key, so a pool is never reused with settings it was not built
// with.
func (s Setup) Key() string { return s.DialTimeout.String() + "\x00" + strconv.Itoa(s.MinConns) }

// SetsPoolParam reports whether a database URL (or keyword/value string) sets
// pgxpool's parameter name. pgxpool.ParseConfig does not tell.
func SetsPoolParam(url, name string) bool {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return false
	}
	_, ok := cfg.RuntimeParams[name]
	return ok
}

// OpenPostgres opens the pool of url, tuned by TunePostgres, and pings it. The URL
// holds the pool's settings (pool_max_conns, …). option is the option url came from:
// database_url for the primary, or database_read_urls for a standby. It names the
// option in errors, and says in the warning what a server that does not answer
// costs.
//
// A PostgreSQL that cannot be reached is not an error here. The gateway starts, logs
// a warning, and answers 503 until the primary is back; the primary answers the
// lookups of a standby that is down. A URL that cannot be parsed is an error.
func OpenPostgres(url, option string, pingTimeout time.Duration, setup Setup, logger *zap.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url) // its errors hide the password
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %v", option, err)
	}
	if !SetsPoolParam(url, "pool_max_conns") {
		// pgxpool's default size (4, or the number of CPUs) is below the floor.
		cfg.MaxConns = max(cfg.MaxConns, cfg.MinConns, int32(setup.MinConns))
	} else if cfg.MaxConns < int32(setup.MinConns) {
		logger.Warn("pool_max_conns is below database_min_conns; while PostgreSQL is slow, batched lookups may wait for a connection past database_timeout",
			zap.Int32("pool_max_conns", cfg.MaxConns), zap.Int("database_min_conns", setup.MinConns))
	}
	TunePostgres(cfg, pingTimeout, setup)
	if !SetsPoolParam(url, "pool_max_conn_lifetime_jitter") {
		// The floor's connections open together at start. Without jitter they
		// would all retire together, every pool_max_conn_lifetime (1h), and the
		// lookups of that moment would wait for new ones.
		cfg.MaxConnLifetimeJitter = cfg.MaxConnLifetime / 4
	}
	// The pool outlives this config, so it is not bound to the config's context.
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, fmt.Errorf("creating postgres pool: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), setup.DialTimeout+pingTimeout)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		msg := "postgres did not answer at start; key lookups answer 503 until it does"
		if option != "database_url" {
			msg = "a postgres standby did not answer at start; the primary answers its key lookups until it does"
		}
		logger.Warn(msg, zap.String("option", option),
			zap.String("host", cfg.ConnConfig.Host), zap.Uint16("port", cfg.ConnConfig.Port), zap.Error(err))
	}
	return pool, nil
}

// TunePostgres sets the pool up for a database that may be slow.
//
// pgxpool pings a connection idle for more than a second before handing it out. That
// is a second round trip on nearly every lookup of a quiet gateway. A database
// answering in over half of database_timeout cannot fit it. So only connections idle
// for a minute are pinged. A connection whose server closed it (a restart, a
// failover) is thrown away as it is handed out, without a round trip
// (pgfailover.Follow). One that dies under its query fails its lookup, and the key
// store retries that once on another connection.
//
// A lookup whose context ends mid-query would, by pgx's default, break its
// connection. Instead PostgreSQL is asked to cancel the query (lookupCancel). The
// connection is kept if it answers within a quarter of timeout, at least 50ms. See
// docs/dependencies.md, What the libraries do when a request gives up.
//
// A new connection opens within setup's dialTimeout, unless the URL's
// connect_timeout says otherwise. Its lookups are prepared before any request uses
// it. The pool keeps setup's floor of connections open, topping it up every few
// seconds (see warm.go). The URL's pool_min_conns, when larger, wins.
func TunePostgres(cfg *pgxpool.Config, timeout time.Duration, setup Setup) {
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = setup.DialTimeout
	}
	cfg.AfterConnect = prepareLookups(setup.DialTimeout)
	cfg.MinConns = min(max(cfg.MinConns, int32(setup.MinConns)), cfg.MaxConns)
	cfg.HealthCheckPeriod = min(cfg.HealthCheckPeriod, minConnsCheckEvery)
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		return p.IdleDuration > time.Minute
	}
	pgfailover.Follow(cfg)
	grace := max(timeout/4, 50*time.Millisecond)
	cfg.ConnConfig.BuildContextWatcherHandler = func(c *pgconn.PgConn) ctxwatch.Handler {
		return &lookupCancel{
			cancel: pgconn.CancelRequestContextWatcherHandler{Conn: c, DeadlineDelay: grace},
			conn:   c,
		}
	}
}

// minConnsCheckEvery is how often, at most, pgxpool tops a pool up to its floor.
const minConnsCheckEvery = 5 * time.Second

// lookupCancel is the context watcher handler of TunePostgres. It asks PostgreSQL to
// cancel the query, as pgconn.CancelRequestContextWatcherHandler does. The exception
// is a lookup a keystore.Batcher runs on its request's goroutine
// (keystore.RequestLookup). The request answers when that lookup returns, so the
// lookup ends at its deadline, as with pgx's default. Such a lookup only runs on a
// lane with no batch in flight. So a slow database gives up at most one connection
// per lane (lookup_lanes) per timeout that way.
type lookupCancel struct {
	cancel pgconn.CancelRequestContextWatcherHandler
	conn   *pgconn.PgConn
	now    bool // the last HandleCancel set the deadline to now
}

func (h *lookupCancel) HandleCancel(ctx context.Context) {
	h.now = keystore.RequestLookup(ctx)
	if h.now {
		h.conn.Conn().SetDeadline(time.Now())
		return
	}
	h.cancel.HandleCancel(ctx)
}

func (h *lookupCancel) HandleUnwatchAfterCancel() {
	if h.now {
		h.conn.Conn().SetDeadline(time.Time{})
		return
	}
	h.cancel.HandleUnwatchAfterCancel()
}
