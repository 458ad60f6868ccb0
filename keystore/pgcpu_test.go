package keystore_test

import (
	"bytes"
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// pgServer is the PostgreSQL server behind a pool, seen as processes of this machine
// (the stack's PostgreSQL runs here), for benchmarks that report the CPU the server
// spends per operation.
type pgServer struct{ postmaster int }

// findPostgres finds the postmaster of the server pool talks to: the parent of one of
// its backends.
func findPostgres(tb testing.TB, pool *pgxpool.Pool) pgServer {
	tb.Helper()
	var backend int
	if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		tb.Fatal(err)
	}
	ppid, ok := parentPID(backend)
	if !ok {
		tb.Fatalf("backend %d is not a process of this machine: PostgreSQL CPU cannot be measured", backend)
	}
	return pgServer{postmaster: ppid}
}

// cpu returns the CPU time the postmaster and every process it runs (backends, workers)
// have spent so far, from /proc/<pid>/schedstat: nanoseconds, where /proc/<pid>/stat
// counts in ticks of 10ms.
func (s pgServer) cpu(tb testing.TB) time.Duration {
	tb.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		tb.Fatal(err)
	}
	var total time.Duration
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pid != s.postmaster {
			if ppid, ok := parentPID(pid); !ok || ppid != s.postmaster {
				continue
			}
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/schedstat")
		if err != nil {
			continue // the process has just exited
		}
		f := bytes.Fields(b)
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(string(f[0]), 10, 64)
		if err != nil {
			tb.Fatalf("/proc/%d/schedstat: %q", pid, b)
		}
		total += time.Duration(ns)
	}
	return total
}

// parentPID reads the parent of process pid from /proc/<pid>/stat.
func parentPID(pid int) (int, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, false
	}
	// The command name, in parentheses, may hold spaces: fields count from its end.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 2 {
		return 0, false
	}
	ppid, err := strconv.Atoi(string(f[1]))
	return ppid, err == nil
}
