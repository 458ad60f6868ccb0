// Package conns opens and keeps the gateway's connections to PostgreSQL and Redis,
// and knows nothing of Caddy. It opens a PostgreSQL pool tuned for a database that
// may be slow (OpenPostgres, TunePostgres) and the Redis client of a redis_mode
// (OpenRedis), keeps a floor of Redis connections open and greeted
// (RedisWarmer), and puts each dependency behind a circuit breaker (Breaker) whose
// probes run on the connections' own budget, never on a request's (PostgresProbe,
// RedisProbe). The Caddy module decides which pools outlive a config reload and
// what each request waits for; this package only makes and keeps the connections.
package conns
