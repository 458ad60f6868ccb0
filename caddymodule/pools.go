package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// pools holds what must outlive one loaded config: PostgreSQL pools, Redis clients,
// the in-process limiter, the metrics and the last-used flushers. Caddy provisions a
// new config before it cleans up the old one. So on a reload with unchanged settings,
// the new handlers take the same entry before the old handlers let go of it. Nothing
// is closed, nothing is dialed again, and in-process rate-limit counts carry over.
// An entry is closed when its last handler is cleaned up.
//
// It is package-level because it has to be: it is the one thing that lives across the
// module instances of successive configs.
var pools = caddy.NewUsagePool()

// pgEntry is a shared PostgreSQL pool.
type pgEntry struct{ pool *pgxpool.Pool }

func (e pgEntry) Destruct() error {
	e.pool.Close()
	return nil
}

// redisEntry is a shared Redis client and the warmer of its pool.
type redisEntry struct {
	client redis.UniversalClient
	warmer *redisWarmer
}

func (e redisEntry) Destruct() error {
	e.warmer.close()
	return e.client.Close()
}

// localEntry is the shared in-process limiter.
type localEntry struct{ lim *limiter.Local }

func (localEntry) Destruct() error { return nil }

// The keys of pools. Each holds every setting its value was built with. So a changed
// setting builds a new value instead of reusing one built differently.
func postgresPoolKey(url string, s connSetup) string {
	return "postgres\x00" + url + "\x00" + s.key()
}

func redisPoolKey(mode, url, caFile string, timeout time.Duration, s connSetup) string {
	return "redis\x00" + mode + "\x00" + url + "\x00" + caFile + "\x00" + timeout.String() + "\x00" + s.key()
}

// connSetup is how a pool opens connections: within dialTimeout, a budget of its
// own, and minConns of them kept open (database_min_conns, redis_min_conns). See
// warm.go.
type connSetup struct {
	dialTimeout time.Duration
	minConns    int
}

func (s connSetup) key() string { return s.dialTimeout.String() + "\x00" + strconv.Itoa(s.minConns) }

const localLimiterKey = "limiter\x00local"

// loadPostgres returns the shared pool for url, creating it if needed, and the key to
// give back to pools.Delete. The URL holds the pool's settings (pool_max_conns, …).
//
// A PostgreSQL that cannot be reached is not an error here. The gateway starts, logs
// a warning, and answers 503 until the database is back. A URL that cannot be parsed
// is an error.
func loadPostgres(url string, pingTimeout time.Duration, setup connSetup, logger *zap.Logger) (*pgxpool.Pool, string, error) {
	key := postgresPoolKey(url, setup)
	v, _, err := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		cfg, err := pgxpool.ParseConfig(url) // its errors hide the password
		if err != nil {
			return nil, fmt.Errorf("parsing database_url: %v", err)
		}
		if !setsPoolParam(url, "pool_max_conns") {
			// pgxpool's default size (4, or the number of CPUs) is below the floor.
			cfg.MaxConns = max(cfg.MaxConns, cfg.MinConns, int32(setup.minConns))
		} else if cfg.MaxConns < int32(setup.minConns) {
			logger.Warn("pool_max_conns is below database_min_conns; while PostgreSQL is slow, batched lookups may wait for a connection past database_timeout",
				zap.Int32("pool_max_conns", cfg.MaxConns), zap.Int("database_min_conns", setup.minConns))
		}
		tunePostgres(cfg, pingTimeout, setup)
		if !setsPoolParam(url, "pool_max_conn_lifetime_jitter") {
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
		ctx, cancel := context.WithTimeout(context.Background(), setup.dialTimeout+pingTimeout)
		defer cancel()
		if err := pool.Ping(ctx); err != nil {
			logger.Warn("postgres did not answer at start; key lookups answer 503 until it does",
				zap.String("host", cfg.ConnConfig.Host), zap.Uint16("port", cfg.ConnConfig.Port), zap.Error(err))
		}
		return pgEntry{pool}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(pgEntry).pool, key, nil
}

// setsPoolParam reports whether a database URL (or keyword/value string) sets
// pgxpool's parameter name. pgxpool.ParseConfig does not tell.
func setsPoolParam(url, name string) bool {
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return false
	}
	_, ok := cfg.RuntimeParams[name]
	return ok
}

// tunePostgres sets the pool up for a database that may be slow.
//
// pgxpool pings a connection idle for more than a second before handing it out. That
// is a second round trip on nearly every lookup of a quiet gateway. A database
// answering in over half of database_timeout cannot fit it. So only connections idle
// for a minute are pinged. A dead connection (after a PostgreSQL restart) fails its
// lookup at once instead, and the key store retries that once on another connection.
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
func tunePostgres(cfg *pgxpool.Config, timeout time.Duration, setup connSetup) {
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = setup.dialTimeout
	}
	cfg.AfterConnect = prepareLookups(setup.dialTimeout)
	cfg.MinConns = min(max(cfg.MinConns, int32(setup.minConns)), cfg.MaxConns)
	cfg.HealthCheckPeriod = min(cfg.HealthCheckPeriod, minConnsCheckEvery)
	cfg.ShouldPing = func(_ context.Context, p pgxpool.ShouldPingParams) bool {
		return p.IdleDuration > time.Minute
	}
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

// lookupCancel is the context watcher handler of tunePostgres. It asks PostgreSQL to
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

// loadRedis returns the shared Redis client for url, creating it if needed, and its
// key in pools.
//
// timeout bounds every part of a command: the wait for a pooled connection, the
// write and the read. setup's dialTimeout bounds a dial (see commandLimits).
// Commands are not retried: a dead Redis must cost a request one timeout, not
// several. As with PostgreSQL, a Redis that is down at start is a warning, not an
// error.
func loadRedis(mode, url, caFile string, timeout time.Duration, setup connSetup, logger *zap.Logger) (redisEntry, string, error) {
	key := redisPoolKey(mode, url, caFile, timeout, setup)
	v, _, err := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		client, addr, err := newRedisClient(mode, url, caFile, timeout, setup.dialTimeout)
		if err != nil {
			// Unlike pgx's, go-redis's errors may quote the URL, password and all.
			return nil, errors.New(redactUserinfo(err.Error(), url))
		}
		ctx, cancel := context.WithTimeout(context.Background(), setup.dialTimeout+timeout)
		defer cancel()
		if err := client.Ping(ctx).Err(); err != nil {
			logger.Warn("redis did not answer at start; limiter_failure applies until it does",
				zap.String("mode", mode), zap.String("addr", addr), zap.Error(err))
		}
		return redisEntry{client, startRedisWarmer(client, setup.minConns, setup.dialTimeout+timeout)}, nil
	})
	if err != nil {
		return redisEntry{}, "", err
	}
	return v.(redisEntry), key, nil
}

// loadLocalLimiter returns the in-process limiter shared by every handler without a
// redis_url. So a reload does not hand every key a fresh budget.
func loadLocalLimiter() (*limiter.Local, string) {
	v, _, _ := pools.LoadOrNew(localLimiterKey, func() (caddy.Destructor, error) {
		return localEntry{limiter.NewLocal()}, nil
	})
	return v.(localEntry).lim, localLimiterKey
}
