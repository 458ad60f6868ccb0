package benchcpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Infoer is the part of a go-redis client Redis needs.
type Infoer interface {
	Info(ctx context.Context, section ...string) *redis.StringCmd
}

// Redis is the CPU time of the Redis server c talks to, reported as "redis-µs/op". It
// adds used_cpu_user and used_cpu_sys of INFO cpu, to the microsecond.
func Redis(c Infoer) Probe {
	return Probe{Unit: "redis-µs/op", Read: func() (time.Duration, error) {
		ctx, cancel := probeContext()
		defer cancel()
		info, err := c.Info(ctx, "cpu").Result()
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %w", err)
		}
		return parseRedisCPU(info)
	}}
}

// parseRedisCPU adds used_cpu_user and used_cpu_sys (seconds) of an INFO cpu answer.
func parseRedisCPU(info string) (time.Duration, error) {
	var total float64
	found := 0
	for line := range strings.Lines(info) {
		name, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "used_cpu_user" && name != "used_cpu_sys") {
			continue
		}
		s, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return 0, fmt.Errorf("INFO cpu: %s: %w", name, err)
		}
		total += s
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("INFO cpu: used_cpu_user or used_cpu_sys missing")
	}
	return time.Duration(total * float64(time.Second)), nil
}

// Querier is the part of a pgx connection or pool Postgres needs.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Postgres is the CPU time of the PostgreSQL server q talks to, reported as
// "pg-µs/op". It adds utime + stime from /proc of the postmaster and of every live
// child, and the reaped children's (the postmaster's cutime + cstime). /proc counts
// in clock ticks of 10 ms, so run long enough: -benchtime 3s or more. The postmaster's
// pid is the first line of postmaster.pid, in SHOW data_directory. So the server must
// run on this machine, and /proc must be readable (the tests run as root, PostgreSQL
// as postgres).
func Postgres(q Querier) (Probe, error) {
	pid, err := postmasterPID(q)
	if err != nil {
		return Probe{}, err
	}
	return Probe{Unit: "pg-µs/op", Read: func() (time.Duration, error) { return treeCPU(pid) }}, nil
}

// Process is the CPU time of the process pid and of its children, live and reaped,
// from /proc as for Postgres, reported under unit: for a server Postgres and Redis do
// not cover, such as PgBouncer.
func Process(pid int, unit string) Probe {
	return Probe{Unit: unit, Read: func() (time.Duration, error) { return treeCPU(pid) }}
}

func postmasterPID(q Querier) (int, error) {
	ctx, cancel := probeContext()
	defer cancel()
	var dir string
	if err := q.QueryRow(ctx, "SHOW data_directory").Scan(&dir); err != nil {
		return 0, fmt.Errorf("SHOW data_directory: %w", err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "postmaster.pid"))
	if err != nil {
		return 0, fmt.Errorf("the postmaster's pid (is PostgreSQL on this machine?): %w", err)
	}
	first, _, _ := strings.Cut(string(data), "\n")
	pid, err := strconv.Atoi(strings.TrimSpace(first))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("postmaster.pid: bad pid %q", first)
	}
	return pid, nil
}

// treeCPU is the CPU time of pid, its reaped children and its live children (found by
// their parent pid in /proc/*/stat).
func treeCPU(pid int) (time.Duration, error) {
	root, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	_, ticks, err := parseStat(string(root), true)
	if err != nil {
		return 0, err
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	for _, e := range entries {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		data, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue // gone meanwhile: its time is in the parent's cutime or elsewhere
		}
		ppid, t, err := parseStat(string(data), true)
		if err == nil && ppid == pid {
			ticks += t
		}
	}
	return time.Duration(ticks) * time.Second / time.Duration(clockTicks()), nil
}

// parseStat reads a /proc/<pid>/stat line: the parent pid, and utime + stime in clock
// ticks (+ cutime + cstime when children). The command name, in parentheses, may
// itself hold spaces and parentheses. So the fields start after the last ") ".
func parseStat(line string, children bool) (ppid int, ticks int64, err error) {
	i := strings.LastIndex(line, ") ")
	if i < 0 {
		return 0, 0, fmt.Errorf("/proc stat: no command name in %q", line)
	}
	f := strings.Fields(line[i+2:])
	// f[0] is field 3 (state): field n is f[n-3].
	if len(f) < 15 {
		return 0, 0, fmt.Errorf("/proc stat: %d fields", len(f)+2)
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return 0, 0, fmt.Errorf("/proc stat: ppid: %w", err)
	}
	last := 15
	if children {
		last = 17
	}
	for n := 14; n <= last; n++ {
		v, err := strconv.ParseInt(f[n-3], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("/proc stat: field %d: %w", n, err)
		}
		ticks += v
	}
	return ppid, ticks, nil
}

// clockTicks is the kernel's USER_HZ, the unit of /proc's times. It reads AT_CLKTCK of
// /proc/self/auxv, since Go has no sysconf. It is 100 when that cannot be read.
func clockTicks() int64 {
	data, err := os.ReadFile("/proc/self/auxv")
	if err != nil {
		return 100
	}
	const atClkTck = 17
	for ; len(data) >= 16; data = data[16:] {
		if binary.NativeEndian.Uint64(data) == atClkTck {
			if v := int64(binary.NativeEndian.Uint64(data[8:])); v > 0 {
				return v
			}
		}
	}
	return 100
}
