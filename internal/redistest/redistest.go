// Package redistest is a test helper: it gives tests the Redis named by REDIS_URL.
// scripts/stack.sh starts that Redis under `make test`. schema/schematest does the
// same for PostgreSQL.
package redistest

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testenv"
)

// URL returns REDIS_URL. It fails the test when REDIS_URL is not set: these tests need
// a real Redis, and `make test` starts one.
func URL(tb testing.TB) string {
	tb.Helper()
	return testenv.Getenv(tb, "REDIS_URL")
}

// Client returns a client of that Redis that has answered PING. The client is closed
// when the test ends.
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
