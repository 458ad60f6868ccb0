package keystore_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema"
	"github.com/keygate/keygate/schema/schematest"
)

// Ids of the usage tests. usage_minutes has no foreign key: any well-formed id does.
const (
	orgA = "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11"
	orgB = "7f000000-0000-4000-8000-000000000001"
	keyA = "AAAAbbbbCCCCdddd"
	keyB = "BBBBccccDDDDeeee"
)

// t0 is a whole UTC minute the usage tests count in.
var t0 = time.Date(2026, 3, 14, 15, 9, 0, 0, time.UTC)

// minuteRows returns usage_minutes as "org key start outcome status count rolled"
// lines, in primary key order.
func minuteRows(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT org_id::text, key_id, start, outcome, status, count, rolled
		FROM usage_minutes ORDER BY org_id, start, key_id COLLATE "C", outcome COLLATE "C", status`)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for rows.Next() {
		var org, key, outcome string
		var start time.Time
		var status int16
		var count, rolled int64
		if err := rows.Scan(&org, &key, &start, &outcome, &status, &count, &rolled); err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s %s %s %d %d %d", org[:4], key[:4], start.UTC().Format("15:04:05"), outcome, status, count, rolled))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func wantLines(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("%s:\n%s\nwant:\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestUsageFlushCountsPerKeyMinuteOutcomeAndStatus(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	var flushed []int
	u := keystore.NewUsage(pool, keystore.UsageOptions{OnFlush: func(rows int, err error) {
		if err != nil {
			t.Errorf("flush failed: %v", err)
		}
		flushed = append(flushed, rows)
	}})
	paris := time.FixedZone("Paris", 3600)
	for range 3 {
		u.Record(orgA, keyA, t0.Add(59*time.Second+999*time.Millisecond), keystore.OutcomeProxied, 200, 1)
	}
	u.Record(orgA, keyA, t0.Add(time.Minute), keystore.OutcomeProxied, 200, 1)           // the next minute
	u.Record(orgA, keyA, t0.Add(time.Minute).In(paris), keystore.OutcomeProxied, 200, 1) // the same instant elsewhere
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 404, 1)
	u.Record(orgA, keyA, t0, keystore.OutcomeMe, 200, 1)
	u.Record(orgA, keyA, t0, keystore.OutcomeRateLimited, 429, 1)
	u.Record(orgA, keyB, t0, keystore.OutcomeForbidden, 403, 1)
	u.Record(strings.ToUpper(orgB), keyB, t0, keystore.OutcomeIPDenied, 401, 1)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"0b8e AAAA 15:09:00 me 200 1 0",
		"0b8e AAAA 15:09:00 proxied 200 3 0",
		"0b8e AAAA 15:09:00 proxied 404 1 0",
		"0b8e AAAA 15:09:00 rate_limited 429 1 0",
		"0b8e BBBB 15:09:00 forbidden 403 1 0",
		"0b8e AAAA 15:10:00 proxied 200 2 0",
		"7f00 BBBB 15:09:00 ip_denied 401 1 0",
	}
	wantLines(t, "usage_minutes", minuteRows(t, pool), want...)

	// Nothing counted since: the next flush writes nothing. Then a count adds to its row.
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	u.Record(orgA, keyA, t0.Add(30*time.Second), keystore.OutcomeMe, 200, 1)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	want[0] = "0b8e AAAA 15:09:00 me 200 2 0"
	wantLines(t, "usage_minutes after a second flush", minuteRows(t, pool), want...)
	if fmt.Sprint(flushed) != "[7 1]" {
		t.Errorf("flushes wrote %v rows, want [7 1]", flushed)
	}
}

func TestUsageOfTwoProcessesAddsUp(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	a := keystore.NewUsage(pool, keystore.UsageOptions{})
	b := keystore.NewUsage(pool, keystore.UsageOptions{})
	for i := range 5 {
		a.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
		if i < 3 {
			b.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
		}
	}
	b.Record(orgA, keyA, t0, keystore.OutcomeProxied, 502, 1)
	for _, u := range []*keystore.Usage{a, b} {
		if err := u.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wantLines(t, "usage_minutes", minuteRows(t, pool),
		"0b8e AAAA 15:09:00 proxied 200 8 0",
		"0b8e AAAA 15:09:00 proxied 502 1 0")
}

// TestUsageFlushesOfManyProcessesAtOnceDoNotDeadlock flushes the same rows from
// several recorders at once, each map in its own random order: only rows sorted
// the same way by every flush keep PostgreSQL from finding a deadlock.
func TestUsageFlushesOfManyProcessesAtOnceDoNotDeadlock(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	const recorders, rounds, keys = 4, 10, 300
	var wg sync.WaitGroup
	var failures atomic.Int64
	for range recorders {
		u := keystore.NewUsage(pool, keystore.UsageOptions{})
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range rounds {
				for k := range keys {
					u.Record(orgA, fmt.Sprintf("key%013d", k), t0, keystore.OutcomeProxied, 200, 1)
				}
				if err := u.Flush(context.Background()); err != nil && failures.Add(1) == 1 {
					t.Logf("flush: %v", err)
				}
			}
			// What a failed flush kept is written now.
			if err := u.Flush(context.Background()); err != nil {
				t.Errorf("last flush: %v", err)
			}
		}()
	}
	wg.Wait()
	if n := failures.Load(); n > 0 {
		t.Errorf("%d flushes failed", n)
	}
	var total, rows int64
	if err := pool.QueryRow(context.Background(), `SELECT sum(count), count(*) FROM usage_minutes`).Scan(&total, &rows); err != nil {
		t.Fatal(err)
	}
	if total != recorders*rounds*keys || rows != keys {
		t.Errorf("%d requests in %d rows, want %d in %d", total, rows, recorders*rounds*keys, keys)
	}
}

// refuseWrites makes PostgreSQL refuse every write to usage_minutes, with an error of
// its own (a write that surely failed), until the returned function is called.
func refuseWrites(t *testing.T, pool *pgxpool.Pool) (restore func()) {
	t.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `ALTER TABLE usage_minutes ADD CONSTRAINT refused CHECK (false) NOT VALID`); err != nil {
		t.Fatal(err)
	}
	return func() {
		if _, err := pool.Exec(ctx, `ALTER TABLE usage_minutes DROP CONSTRAINT refused`); err != nil {
			t.Fatal(err)
		}
	}
}

func TestUsageKeepsTheCountsOfAFailedFlush(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	for _, tc := range []struct {
		name string
		pool *pgxpool.Pool
		fail func(u *keystore.Usage) error
	}{
		{"never sent", pool, func(u *keystore.Usage) error {
			dead, cancel := context.WithCancel(ctx)
			cancel()
			return u.Flush(dead)
		}},
		{"refused by PostgreSQL", pool, func(u *keystore.Usage) error {
			defer refuseWrites(t, pool)()
			return u.Flush(ctx)
		}},
		{"cut short by its timeout", pool, func(u *keystore.Usage) error {
			tx := holdLocks(t, pool, `LOCK TABLE usage_minutes IN EXCLUSIVE MODE`)
			defer tx.Rollback(ctx)
			short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			return u.Flush(short)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `TRUNCATE usage_minutes`); err != nil {
				t.Fatal(err)
			}
			var errs []error
			u := keystore.NewUsage(tc.pool, keystore.UsageOptions{OnFlush: func(_ int, err error) { errs = append(errs, err) }})
			u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
			u.Record(orgA, keyB, t0, keystore.OutcomeProxied, 200, 1)
			if err := tc.fail(u); err == nil {
				t.Fatal("the flush succeeded")
			}
			u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1) // counted after the failure
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			if err := u.Flush(ctx); err != nil { // nothing left: writes nothing
				t.Fatal(err)
			}
			wantLines(t, "usage_minutes", minuteRows(t, pool),
				"0b8e AAAA 15:09:00 proxied 200 2 0",
				"0b8e BBBB 15:09:00 proxied 200 1 0")
			if len(errs) != 2 || errs[0] == nil || errs[1] != nil {
				t.Errorf("OnFlush saw %v, want a failure then a success", errs)
			}
		})
	}
}

// TestUsageWriteCutShortIsCountedOnce holds PostgreSQL's answer back past the flush's
// timeout: the write is made, but the flush cannot know it. Sent again, it must write
// nothing.
func TestUsageWriteCutShortIsCountedOnce(t *testing.T) {
	ctx := context.Background()
	direct, dbURL := schematest.NewPool(t)
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := schematest.Proxied(t, cfg)
	cfg.MaxConns = 1
	pool := schematest.OpenPool(t, cfg)

	// A first flush prepares the statement on the connection: then the flush below is
	// one round trip, which reaches PostgreSQL at once.
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	u.Record(orgB, keyB, t0, keystore.OutcomeMe, 200, 1)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := direct.Exec(ctx, `TRUNCATE usage_minutes`); err != nil {
		t.Fatal(err)
	}
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	proxy.SetDelay(2 * time.Second)
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if err := u.Flush(short); err == nil {
		t.Fatal("a flush whose answer came after its timeout succeeded")
	}
	wantLines(t, "usage_minutes, written by the flush that timed out", minuteRows(t, direct), "0b8e AAAA 15:09:00 proxied 200 1 0")
	if got := u.Pending(orgA, t0); got != 1 {
		t.Errorf("Pending = %d, want the request whose write is unsure", got)
	}
	proxy.SetDelay(0)
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "usage_minutes", minuteRows(t, direct), "0b8e AAAA 15:09:00 proxied 200 2 0")
	if got := u.Pending(orgA, t0); got != 0 {
		t.Errorf("Pending = %d after the flush, want 0", got)
	}
}

func TestUsageIsBoundedAndCountsTheRequestsItDrops(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	var dropped atomic.Int64
	for _, tc := range []struct {
		name string
		// fail makes the next flush fail, until the function it returns is called.
		fail func() (restore func())
		ctx  func() (context.Context, context.CancelFunc)
		// dropped is what Record drops while the failed flush's rows are held. Those
		// of a write that surely failed are counted again as they were, and take the
		// next request of their row; those of a write that may have been made wait in
		// their batch, apart.
		dropped int64
	}{
		{"refused by PostgreSQL", func() func() { return refuseWrites(t, pool) },
			func() (context.Context, context.CancelFunc) { return ctx, func() {} }, 2},
		{"cut short", func() func() {
			tx := holdLocks(t, pool, `LOCK TABLE usage_minutes IN EXCLUSIVE MODE`)
			return func() { _ = tx.Rollback(ctx) }
		}, func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 300*time.Millisecond) }, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := pool.Exec(ctx, `TRUNCATE usage_minutes`); err != nil {
				t.Fatal(err)
			}
			dropped.Store(0)
			u := keystore.NewUsage(pool, keystore.UsageOptions{MaxPending: 2, OnDrop: func(n int) { dropped.Add(int64(n)) }})
			for range 3 {
				u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
				u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 500, 1)
				u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 404, 1) // a third row: dropped
			}
			if got := dropped.Load(); got != 3 {
				t.Errorf("dropped %d requests, want 3", got)
			}
			// The rows of a flush in flight, then of a failed one, still hold their places.
			restore := tc.fail()
			failed := make(chan error, 1)
			go func() {
				fctx, cancel := tc.ctx()
				defer cancel()
				failed <- u.Flush(fctx)
			}()
			time.Sleep(100 * time.Millisecond) // let the flush take its rows: nothing shows them taken
			u.Record(orgB, keyB, t0, keystore.OutcomeMe, 200, 1)
			if err := <-failed; err == nil {
				t.Fatal("the flush succeeded")
			}
			u.Record(orgB, keyB, t0, keystore.OutcomeMe, 200, 1)
			u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
			restore()
			if got := dropped.Load(); got != 3+tc.dropped {
				t.Errorf("dropped %d requests, want %d", got, 3+tc.dropped)
			}
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			// There is room again.
			u.Record(orgB, keyB, t0, keystore.OutcomeMe, 200, 1)
			if err := u.Flush(ctx); err != nil {
				t.Fatal(err)
			}
			wantLines(t, "usage_minutes", minuteRows(t, pool),
				fmt.Sprintf("0b8e AAAA 15:09:00 proxied 200 %d 0", 6-tc.dropped),
				"0b8e AAAA 15:09:00 proxied 500 3 0",
				"7f00 BBBB 15:09:00 me 200 1 0")
		})
	}
}

func TestUsageDropsWhatItCannotWrite(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	var dropped atomic.Int64
	u := keystore.NewUsage(pool, keystore.UsageOptions{OnDrop: func(n int) { dropped.Add(int64(n)) }})
	for _, tc := range []struct {
		org, key string
		outcome  keystore.Outcome
		status   int
	}{
		{orgA, keyA, keystore.OutcomeUnauthenticated, 401}, // no key to count it against
		{orgA, keyA, keystore.NumOutcomes, 200},            // no outcome
		{orgA, keyA, keystore.OutcomeProxied, 99},
		{orgA, keyA, keystore.OutcomeProxied, 600},
		{"acme", keyA, keystore.OutcomeProxied, 200},
		{orgA + "0", keyA, keystore.OutcomeProxied, 200},
		{orgA, "short", keystore.OutcomeProxied, 200},
		{orgA, keyA + "-", keystore.OutcomeProxied, 200},
	} {
		u.Record(tc.org, tc.key, t0, tc.outcome, tc.status, 1)
	}
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	if err := u.Flush(context.Background()); err != nil {
		t.Fatalf("a bad request held the good one back: %v", err)
	}
	if got := dropped.Load(); got != 8 {
		t.Errorf("dropped %d, want 8", got)
	}
	wantLines(t, "usage_minutes", minuteRows(t, pool), "0b8e AAAA 15:09:00 proxied 200 1 0")
}

// TestUsageRecordDoesNotWaitForABlockedFlush holds usage_minutes locked, so that a
// flush waits on it, and records meanwhile, in the rows being flushed and in new ones.
func TestUsageRecordDoesNotWaitForABlockedFlush(t *testing.T) {
	ctx := context.Background()
	pool, _ := schematest.NewPool(t)
	tx := holdLocks(t, pool, `LOCK TABLE usage_minutes IN EXCLUSIVE MODE`)
	u := keystore.NewUsage(pool, keystore.UsageOptions{})
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	flushed := make(chan error, 1)
	go func() { flushed <- u.Flush(ctx) }()
	waitForALockWait(t, pool)
	select {
	case err := <-flushed:
		t.Fatalf("the flush returned (%v) while the table was locked", err)
	default:
	}
	recorded := make(chan struct{})
	go func() {
		for range 1000 {
			u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
			u.Record(orgA, keyB, t0, keystore.OutcomeMe, 200, 1)
		}
		close(recorded)
	}()
	select {
	case <-recorded:
	case <-time.After(5 * time.Second):
		t.Fatal("Record waited for the blocked flush")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-flushed; err != nil {
		t.Fatalf("the flush failed once the lock was released: %v", err)
	}
	if err := u.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	wantLines(t, "usage_minutes", minuteRows(t, pool),
		"0b8e AAAA 15:09:00 proxied 200 1001 0",
		"0b8e BBBB 15:09:00 me 200 1000 0")
}

func TestUsageRunFlushesEveryIntervalAndOnceMoreWhenStopped(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	u := keystore.NewUsage(pool, keystore.UsageOptions{Interval: 100 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.Run(ctx); close(done) }()
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	testenv.Eventually(t, 10*time.Second, "Run's flush at an interval of 100ms", func() bool {
		return len(minuteRows(t, pool)) > 0
	})
	cancel()
	<-done

	// An hour's interval: only the flush of a stopping Run can write this.
	u = keystore.NewUsage(pool, keystore.UsageOptions{Interval: time.Hour})
	ctx, cancel = context.WithCancel(context.Background())
	done = make(chan struct{})
	go func() { u.Run(ctx); close(done) }()
	u.Record(orgA, keyB, t0, keystore.OutcomeMe, 200, 1)
	cancel()
	<-done
	wantLines(t, "usage_minutes", minuteRows(t, pool),
		"0b8e AAAA 15:09:00 proxied 200 1 0",
		"0b8e BBBB 15:09:00 me 200 1 0")
}

func TestUsageRunStopsWithinItsTimeoutWhenTheDatabaseHangs(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	holdLocks(t, pool, `LOCK TABLE usage_minutes IN EXCLUSIVE MODE`)
	const timeout = 300 * time.Millisecond
	u := keystore.NewUsage(pool, keystore.UsageOptions{Interval: time.Hour, Timeout: timeout})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { u.Run(ctx); close(done) }()
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1)
	start := time.Now()
	cancel()
	select {
	case <-done:
	case <-time.After(20 * timeout):
		t.Fatalf("Run did not return within %v of its stop, its flush's timeout being %v", 20*timeout, timeout)
	}
	if waited := time.Since(start); waited < timeout {
		t.Errorf("Run returned after %v, before its last flush could time out", waited)
	}
}

func TestNilUsageRecordsNothing(t *testing.T) {
	var u *keystore.Usage
	u.Record(orgA, keyA, t0, keystore.OutcomeProxied, 200, 1) // must not panic
	if n := u.Pending(orgA, t0); n != 0 {
		t.Errorf("a nil Usage holds %d", n)
	}
}

func TestUsageRecordAllocatesNothingOnceTheRowExists(t *testing.T) {
	u := keystore.NewUsage(nil, keystore.UsageOptions{})
	// The ids as a request holds them: in memory of its own.
	org, key := string([]byte(orgA)), string([]byte(keyA))
	at := t0.Add(10 * time.Second)
	u.Record(org, key, at, keystore.OutcomeProxied, 200, 1)
	if n := testing.AllocsPerRun(1000, func() {
		u.Record(org, key, at, keystore.OutcomeProxied, 200, 1)
	}); n != 0 {
		t.Errorf("Record of an existing row: %v allocations, want 0", n)
	}
}

// BenchmarkUsageRecord counts requests of 64 keys, each counted before (as after the
// first request of a minute), from one goroutine and from GOMAXPROCS at once.
func BenchmarkUsageRecord(b *testing.B) {
	keys := make([]string, 64)
	for i := range keys {
		keys[i] = fmt.Sprintf("key%013d", i)
	}
	at := time.Now()
	for _, parallel := range []bool{false, true} {
		b.Run(fmt.Sprintf("parallel=%v", parallel), func(b *testing.B) {
			u := keystore.NewUsage(nil, keystore.UsageOptions{})
			for _, k := range keys {
				u.Record(orgA, k, at, keystore.OutcomeProxied, 200, 1)
			}
			b.ReportAllocs()
			b.ResetTimer()
			if !parallel {
				for i := range b.N {
					u.Record(orgA, keys[i%len(keys)], at, keystore.OutcomeProxied, 200, 1)
				}
				return
			}
			var seq atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				i := int(seq.Add(1))
				for pb.Next() {
					u.Record(orgA, keys[i%len(keys)], at, keystore.OutcomeProxied, 200, 1)
					i++
				}
			})
		})
	}
}

// exampleDatabase creates a migrated database of its own for an example, which has no
// *testing.T for schematest, and returns its URL and what drops it.
func exampleDatabase() (string, func()) {
	ctx := context.Background()
	base := os.Getenv("DATABASE_URL")
	if base == "" {
		panic("DATABASE_URL is not set: the examples need PostgreSQL (scripts/stack.sh up)")
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "example_" + hex.EncodeToString(b[:])
	admin, err := pgx.Connect(ctx, base)
	if err != nil {
		panic(err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		panic(err)
	}
	u, _ := url.Parse(base)
	u.Path = "/" + name
	if err := schema.Migrate(ctx, u.String()); err != nil {
		panic(err)
	}
	return u.String(), func() {
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
		admin.Close(ctx)
	}
}

// A gateway counts every request of an identified key as it answers it, and writes the
// counts in the background. Stopping Run writes what is left.
func ExampleUsage() {
	dbURL, drop := exampleDatabase()
	defer drop()
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	usage := keystore.NewUsage(pool, keystore.UsageOptions{Interval: 10 * time.Second})
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { usage.Run(ctx); close(done) }()

	org, key := "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", "AbCdEfGhIjKlMnOpQrStUv"
	now := time.Now()
	usage.Record(org, key, now, keystore.OutcomeProxied, 200, 1)
	usage.Record(org, key, now, keystore.OutcomeProxied, 200, 1)
	usage.Record(org, key, now, keystore.OutcomeRateLimited, 429, 1)
	fmt.Println("not written yet, this month:", usage.Pending(org, now))

	stop()
	<-done
	format, _ := keystore.NewFormat("mon")
	used, err := keystore.New(pool, format).MonthUsed(context.Background(), org, now)
	if err != nil {
		panic(err)
	}
	fmt.Println("written, this month:", used)
	// Output:
	// not written yet, this month: 2
	// written, this month: 2
}
