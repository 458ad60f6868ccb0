// Package testenv is the harness that the tests of several packages share: the
// servers scripts/stack.sh starts, named by environment variables that
// scripts/test.sh sets, and the HTTP exchange and log buffer their tests all need.
// It knows nothing of the gateway or the upstream, so that every test package can
// use it.
package testenv

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"sync"
	"testing"
)

// Getenv returns the environment variable name, failing the test when it is not
// set: these tests need the real servers scripts/stack.sh starts (up, up-cluster,
// up-tls, up-sentinel, up-pgbouncer), and `make test` starts them and sets it.
func Getenv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		tb.Fatalf("%s is not set: run the tests with `make test`, which starts the servers (scripts/stack.sh) and sets it", name)
	}
	return v
}

// GetenvOrSkip is Getenv for a test that may be skipped without its server: it
// skips the test when name is not set.
func GetenvOrSkip(tb testing.TB, name string) string {
	tb.Helper()
	if os.Getenv(name) == "" {
		tb.Skipf("%s is not set (scripts/stack.sh up-cluster, up-tls or up-sentinel DIR)", name)
	}
	return Getenv(tb, name)
}

// Exchange sends req with c and returns the response with its whole body, read and
// closed, failing the test when either the request or the read fails.
func Exchange(tb testing.TB, c *http.Client, req *http.Request) (*http.Response, []byte) {
	tb.Helper()
	res, err := c.Do(req)
	if err != nil {
		tb.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		tb.Fatalf("%s %s: reading body: %v", req.Method, req.URL, err)
	}
	return res, b
}

// Buffer is a bytes.Buffer that a process's or a logger's goroutines may write
// while the test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
