package caddymodule

import (
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

// loadPostgres returns the shared pool for url, creating it if needed
// (conns.OpenPostgres), and the key to give back to pools.Delete. option is the
// option url came from.
func loadPostgres(url, option string, pingTimeout time.Duration, setup conns.Setup, logger *zap.Logger) (*pgxpool.Pool, string, error) {
	key := postgresPoolKey(url, setup)
	v, _, err := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		pool, err := conns.OpenPostgres(url, option, pingTimeout, setup, logger)
		if err != nil {
			return nil, err
		}
		return pgEntry{pool}, nil
	})
	if err != nil {
		return nil, "", err
	}
	return v.(pgEntry).pool, key, nil
}

// loadRedis returns the shared Redis client for url, creating it if needed
// (conns.OpenRedis), and its key in pools.
func loadRedis(mode, url, caFile string, timeout time.Duration, setup conns.Setup, logger *zap.Logger) (redisEntry, string, error) {
	key := redisPoolKey(mode, url, caFile, timeout, setup)
	v, _, err := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		client, warmer, err := conns.OpenRedis(mode, url, caFile, timeout, setup, logger)
		if err != nil {
			return nil, err
		}
		return redisEntry{client, warmer}, nil
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
