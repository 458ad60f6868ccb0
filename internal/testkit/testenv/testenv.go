// Package testenv is a test helper: the harness that the tests of several packages
// share. It finds the servers scripts/stack.sh starts, by the environment variables
// scripts/test.sh sets. It also holds the HTTP exchange and the log buffer that many
// tests need. It knows nothing of the gateway or the upstream, so every test package
// can use it.
package testenv

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// Getenv returns the environment variable name. It fails the test when name is not
// set. These tests need the real servers that scripts/stack.sh starts (up,
// up-cluster, up-tls, up-sentinel, up-pgbouncer). `make test` starts them and sets
// their variables.
func Getenv(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		tb.Fatalf("%s is not set: run the tests with `make test`, which starts the servers (scripts/stack.sh) and sets it", name)
	}
	return v
}

// GetenvOrSkip is Getenv for a test that may run without its server. It skips the
// test when name is not set.
func GetenvOrSkip(tb testing.TB, name string) string {
	tb.Helper()
	if os.Getenv(name) == "" {
		tb.Skipf("%s is not set (scripts/stack.sh up-cluster, up-tls or up-sentinel DIR)", name)
	}
	return Getenv(tb, name)
}

// Exchange sends req with c and returns the response and its whole body, read and
// closed. It fails the test when the request or the read fails.
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

// Buffer is a bytes.Buffer that is safe for concurrent use. A process's or a
// logger's goroutines may write it while the test reads it.
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

// Eventually waits until cond holds and fails tb, naming what it waited for, if it
// does not hold within timeout. It returns at once when cond already holds. It asks
// cond every millisecond at first, then less often, up to every 10ms: a state that
// comes soon is seen soon, and a long wait does not spin. Tests wait on the event
// itself this way, not on a sleep long enough on an idle machine.
func Eventually(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	if !Within(timeout, cond) {
		tb.Fatalf("%s: not within %v", what, timeout)
	}
}

// Within waits as Eventually does and reports whether cond held within timeout. It
// is for an event that may rightly never come, for a wait whose failure the caller
// reports with what it saw, and for a goroutine that must not fail its test.
func Within(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for every := time.Millisecond; !cond(); every = min(2*every, 10*time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(every)
	}
	return true
}

// Goroutines counts the goroutines whose stack, as runtime.Stack prints it (its first
// line says what it waits on, as in "[select]"), holds every one of parts.
func Goroutines(parts ...string) int {
	buf := make([]byte, 1<<20)
	for {
		k := runtime.Stack(buf, true)
		if k < len(buf) {
			buf = buf[:k]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	n := 0
next:
	for _, g := range bytes.Split(buf, []byte("\n\n")) {
		for _, p := range parts {
			if !bytes.Contains(g, []byte(p)) {
				continue next
			}
		}
		n++
	}
	return n
}

// StackEnv reads the lines `export NAME='value'` of the env file scripts/stack.sh
// writes in its directory (path), for the servers a test starts of its own.
func StackEnv(tb testing.TB, path string) map[string]string {
	tb.Helper()
	f, err := os.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, value, ok := strings.Cut(strings.TrimPrefix(sc.Text(), "export "), "=")
		if ok {
			env[name] = strings.Trim(value, "'")
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return env
}
