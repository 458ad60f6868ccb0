// Package redistest gives tests the Redis named by REDIS_URL (started by
// scripts/stack.sh under `make test`), as schematest does PostgreSQL.
package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testenv"
)

// URL returns REDIS_URL, failing the test when it is not set: these tests need a real
// Redis and are run through `make test`, which starts one.
func URL(tb testing.TB) string {
	tb.Helper()
	return testenv.Getenv(tb, "REDIS_URL")
}

// Client returns a client of that Redis, answering PING, closed when the test ends.
func Client(tb testing.TB) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(URL(tb))
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	tb.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("pinging redis: %v", err)
	}
	return c
}
