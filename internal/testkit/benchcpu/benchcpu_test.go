package benchcpu

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/testkit/redistest"
)

func TestParseStat(t *testing.T) {
	// A command name with spaces and a ") " of its own; fields 14-17 are 7 11 13 17.
	line := "4242 (post gres) x) S 17 4242 4242 0 -1 4194560 100 0 0 0 7 11 13 17 20 0 1 0 5 1000 10\n"
	tests := []struct {
		children  bool
		wantTicks int64
	}{
		{children: false, wantTicks: 7 + 11},
		{children: true, wantTicks: 7 + 11 + 13 + 17},
	}
	for _, tt := range tests {
		ppid, ticks, err := parseStat(line, tt.children)
		if err != nil || ppid != 17 || ticks != tt.wantTicks {
			t.Errorf("parseStat(children=%v) = %d, %d, %v; want 17, %d, nil", tt.children, ppid, ticks, err, tt.wantTicks)
		}
	}
	for _, bad := range []string{"", "4242 no parens S 1 2", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 u 11 13 17 20"} {
		if _, _, err := parseStat(bad, true); err == nil {
			t.Errorf("parseStat(%q) = nil error", bad)
		}
	}
}

func TestParseRedisCPU(t *testing.T) {
	info := "# CPU\r\nused_cpu_sys:1.250000\r\nused_cpu_user:0.500001\r\nused_cpu_sys_children:9.000000\r\n"
	got, err := parseRedisCPU(info)
	if want := 1750001 * time.Microsecond; err != nil || got != want {
		t.Errorf("parseRedisCPU = %v, %v; want %v, nil", got, err, want)
	}
	for _, bad := range []string{"# CPU\r\n", "used_cpu_sys:1\r\n", "used_cpu_sys:x\r\nused_cpu_user:1\r\n"} {
		if _, err := parseRedisCPU(bad); err == nil {
			t.Errorf("parseRedisCPU(%q) = nil error", bad)
		}
	}
}

// TestSelfAndTree burns CPU until getrusage has counted 200ms more. /proc, read
// through Process, must have counted as much for this process, within a few clock ticks.
func TestSelfAndTree(t *testing.T) {
	self, proc := Self(), Process(os.Getpid(), "proc-µs/op")
	s0, err := self.Read()
	if err != nil {
		t.Fatal(err)
	}
	p0, err := proc.Read()
	if err != nil {
		t.Fatal(err)
	}
	var s1 time.Duration
	for deadline := time.Now().Add(20 * time.Second); s1-s0 < 200*time.Millisecond; {
		if time.Now().After(deadline) {
			t.Fatalf("getrusage grew by %v in 20s of spinning", s1-s0)
		}
		spin(10 * time.Millisecond)
		if s1, err = self.Read(); err != nil {
			t.Fatal(err)
		}
	}
	p1, err := proc.Read()
	if err != nil {
		t.Fatal(err)
	}
	if ds, dp := s1-s0, p1-p0; dp < ds-50*time.Millisecond || dp > ds+50*time.Millisecond {
		t.Errorf("getrusage grew by %v, /proc by %v", ds, dp)
	}
	if hz := clockTicks(); hz <= 0 {
		t.Errorf("clockTicks = %d", hz)
	}
}

// spin burns CPU on this goroutine for d of wall time.
func spin(d time.Duration) {
	var sink atomic.Int64
	for end := time.Now().Add(d); time.Now().Before(end); {
		for i := range 10000 {
			sink.Add(int64(i))
		}
	}
}

func TestParallel(t *testing.T) {
	for _, n := range []int{1, 4, 32} {
		var calls [1000]atomic.Int32
		var running, peak atomic.Int32
		parallel(len(calls), n, func(i int) {
			r := running.Add(1)
			for p := peak.Load(); r > p && !peak.CompareAndSwap(p, r); p = peak.Load() {
			}
			time.Sleep(100 * time.Microsecond) // an op that takes time, so that ops overlap
			calls[i].Add(1)
			running.Add(-1)
		})
		for i := range calls {
			if c := calls[i].Load(); c != 1 {
				t.Fatalf("n=%d: op(%d) called %d times", n, i, c)
			}
		}
		if p := peak.Load(); p > int32(n) {
			t.Errorf("n=%d: %d ops ran at once", n, p)
		}
	}
}

// TestRedis reads the CPU time of the stack's Redis (REDIS_URL) around 2000 PINGs.
func TestRedis(t *testing.T) {
	c := redistest.Client(t)
	p := Redis(c)
	if p.Unit != "redis-µs/op" {
		t.Errorf("Unit = %q", p.Unit)
	}
	before, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	for range 2000 {
		if err := c.Ping(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	after, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	if after <= before {
		t.Errorf("Redis's CPU time went from %v to %v over 2000 PINGs", before, after)
	}
}

// TestPostgres finds the stack's postmaster (DATABASE_URL) and sees its CPU time grow
// while queries run.
func TestPostgres(t *testing.T) {
	u := os.Getenv("DATABASE_URL")
	if u == "" {
		t.Fatal("DATABASE_URL is not set: run the tests with `make test`, which starts PostgreSQL and Redis")
	}
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pid, err := postmasterPID(conn)
	if err != nil {
		t.Fatal(err)
	}
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		t.Fatalf("pid %d from postmaster.pid: comm %q, %v; want postgres", pid, comm, err)
	}
	p, err := Postgres(conn)
	if err != nil {
		t.Fatal(err)
	}
	before, err := p.Read()
	if err != nil {
		t.Fatal(err)
	}
	// The backend's time is counted in clock ticks. Query until a few have passed.
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := conn.Exec(ctx, "SELECT count(*) FROM generate_series(1, 20000)"); err != nil {
			t.Fatal(err)
		}
		after, err := p.Read()
		if err != nil {
			t.Fatal(err)
		}
		if after >= before+30*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("PostgreSQL's CPU time went from %v to %v in 20s of queries", before, after)
		}
	}
}
