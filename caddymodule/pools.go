package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/keygate/keygate/caddymodule/conns"
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
	warmer *conns.RedisWarmer
}

func (e redisEntry) Destruct() error {
	e.warmer.Close()
	return e.client.Close()
}

// localEntry is the shared in-process limiter.
type localEntry struct{ lim *limiter.Local }

func (localEntry) Destruct() error { return nil }

// The keys of pools. Each holds every setting its value was built with. So a changed
// setting builds a new value instead of reusing one built differently.
func postgresPoolKey(url string, s conns.Setup) string {
	return "postgres\x00" + url + "\x00" + s.Key()
}

func redisPoolKey(mode, url, caFile string, timeout time.Duration, s conns.Setup) string {
	return "redis\x00" + mode + "\x00" + url + "\x00" + caFile + "\x00" + timeout.String() + "\x00" + s.Key()
}

const localLimiterKey = "limiter\x00local"

// loadPostgres returns the shared pool for url, creating it if needed, and the key to
// give back to pools.Delete. The URL holds the pool's settings (pool_max_conns, …).
//
// option is the option url came from: database_url for the primary, or
// database_read_urls for a standby. It names the option in errors, and says in the
// warning what a server that does not answer costs.
//
// A PostgreSQL that cannot be reached is not an error here. The gateway starts, logs
// a warning, and answers 503 until the primary is back; the primary answers the
// lookups of a standby that is down. A URL that cannot be parsed is an error.
func loadPostgres(url, option string, pingTimeout time.Duration, setup conns.Setup, logger *zap.Logger) (*pgxpool.Pool, string, error) {
	key := postgresPoolKey(url, setup)
	v, _, err := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		cfg, err := pgxpool.ParseConfig(url) // its errors hide the password
		if err != nil {
			return nil, fmt.Errorf("parsing %s: %v", option, err)
		}
		if !conns.SetsPoolParam(url, "pool_max_conns") {
			// pgxpool's default size (4, or the number of CPUs) is below the floor.
			cfg.MaxConns = max(cfg.MaxConns, cfg.MinConns, int32(setup.MinConns))
		} else if cfg.MaxConns < int32(setup.MinConns) {
			logger.Warn("pool_max_conns is below database_min_conns; while PostgreSQL is slow, batched lookups may wait for a connection past database_timeout",
				zap.Int32("pool_max_conns", cfg.MaxConns), zap.Int("database_min_conns", setup.MinConns))
		}
		conns.TunePostgres(cfg, pingTimeout, setup)
		if !conns.SetsPoolParam(url, "pool_max_conn_lifetime_jitter") {
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
		return pgEntry{pool}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(pgEntry).pool, key, nil
}

// loadRedis returns the shared Redis client for url, creating it if needed, and its
// key in pools.
//
// timeout bounds every part of a command: the wait for a pooled connection, the
// write and the read. setup's DialTimeout bounds a dial (see commandLimits).
// Commands are not retried: a dead Redis must cost a request one timeout, not
// several. As with PostgreSQL, a Redis that is down at start is a warning, not an
// error.
func loadRedis(mode, url, caFile string, timeout time.Duration, setup conns.Setup, logger *zap.Logger) (redisEntry, string, error) {
	key := redisPoolKey(mode, url, caFile, timeout, setup)
	v, _, err := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		client, addr, err := newRedisClient(mode, url, caFile, timeout, setup.DialTimeout)
		if err != nil {
			// Unlike pgx's, go-redis's errors may quote the URL, password and all.
			return nil, errors.New(redactUserinfo(err.Error(), url))
		}
		ctx, cancel := context.WithTimeout(context.Background(), setup.DialTimeout+timeout)
		defer cancel()
		if err := client.Ping(ctx).Err(); err != nil {
			logger.Warn("redis did not answer at start; limiter_failure applies until it does",
				zap.String("mode", mode), zap.String("addr", addr), zap.Error(err))
		}
		return redisEntry{client, conns.StartRedisWarmer(client, setup.MinConns, setup.DialTimeout+timeout)}, nil
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
		return localEntry{limiter.NewLocal(limiter.WithClock(clock))}, nil
	})
	return v.(localEntry).lim, localLimiterKey
}
