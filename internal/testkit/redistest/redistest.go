// Package redistest is a test helper: it gives tests the Redis named by REDIS_URL.
// scripts/stack.sh starts that Redis under `make test`. schema/schematest does the
// same for PostgreSQL. Own starts a Redis of a test's own, for tests that the shared
// one's server-wide events would upset.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testkit/testenv"
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
	return Connect(tb, URL(tb))
}

// Connect returns a client of the Redis at url that has answered PING. The client is
// closed when the test ends.
func Connect(tb testing.TB, url string) *redis.Client {
	tb.Helper()
	opt, err := redis.ParseURL(url)
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

// Own starts a Redis of the test's own and returns its URL. The server stops when the
// test ends.
//
// `go test` runs packages side by side on the shared Redis. A test there may flush the
// scripts at any moment, as a restart or failover would. The next count then pays a
// NOSCRIPT round trip. A test that holds Redis at a large share of its timeout has no
// room for that round trip, so it needs a Redis no other test reaches.
func Own(tb testing.TB) string {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Fatalf("a Redis of the test's own: %v (scripts/stack.sh installs redis-server)", err)
	}
	for range 5 {
		if url, ok := start(tb, bin); ok {
			return url
		}
	}
	tb.Fatal("a Redis of the test's own did not start in 5 tries")
	return ""
}

// start runs redis-server on a port that was free a moment ago. It reports false if
// the server did not answer PING within 5 s: another process may have taken the port.
func start(tb testing.TB, bin string) (string, bool) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--logfile", "")
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	stop := func() {
		cmd.Process.Kill()
		<-exited
	}
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	opt, _ := redis.ParseURL(url)
	c := redis.NewClient(opt)
	defer c.Close()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		select {
		case <-exited:
			return "", false
		default:
		}
		if c.Ping(context.Background()).Err() == nil {
			tb.Cleanup(stop)
			return url, true
		}
	}
	stop()
	return "", false
}
