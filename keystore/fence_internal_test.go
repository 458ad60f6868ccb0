package keystore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/schema/schematest"
)

// TestFenceTargetSkipsThePageHeader: an insert position just past a page's header
// asks only for the page's boundary, where a standby that replayed everything stops.
// Any other position is the target as it is.
func TestFenceTargetSkipsThePageHeader(t *testing.T) {
	for _, tc := range []struct {
		name   string
		insert LSN
		want   LSN
	}{
		{"past a short page header", 0x4002000 + 24, 0x4002000},
		{"past a segment's long page header", 0x5000000 + 40, 0x5000000},
		{"on a boundary", 0x4002000, 0x4002000},
		{"a record's end on the page", 0x4002000 + 48, 0x4002000 + 48},
		{"mid page", 0x4001100, 0x4001100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := fenceTarget(tc.insert); got != tc.want {
				t.Errorf("fenceTarget(%#x) = %#x, want %#x", tc.insert, got, tc.want)
			}
		})
	}
}

// TestFenceSendsAReadingOnlyWhenABatchAsks: a reading a lookup holds goes out only
// when its batch asks for it, and one asked for while another is in flight goes out
// as that one answers, never before. Lookups arriving meanwhile hold it too. Nothing
// else sends readings: a busy gateway sends at most one a batch.
func TestFenceSendsAReadingOnlyWhenABatchAsks(t *testing.T) {
	const delay = 100 * time.Millisecond
	slow, _ := slowPool(t, delay)
	f := newFence(slow, 5*time.Second)
	ctx := context.Background()

	// inFlight reports whether a reading is in flight, and whether r has been sent.
	inFlight := func(r *reading) (sending, sent bool) {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.sending, !r.sent.IsZero()
	}

	first := f.hold()
	if again := f.hold(); again != first {
		t.Fatal("two lookups arriving together hold different readings")
	}
	if sending, sent := inFlight(first); sending || sent || f.readings.Load() != 0 {
		t.Fatalf("a reading sent before any batch asked (in flight %v, held one sent %v)", sending, sent)
	}
	first.send()
	second := f.hold()
	if second == first {
		t.Fatal("a lookup arriving after the reading was sent holds it")
	}
	second.send() // while first is in flight
	if f.hold() != second {
		t.Fatal("a lookup arriving before the asked-for reading goes out holds another one")
	}
	_, firstSent, err := first.await(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 5*time.Second, "the second reading going out", func() bool {
		_, sent := inFlight(second)
		return sent
	})
	third := f.hold() // while the second is in flight; no batch asks for it
	if third == second {
		t.Fatal("a lookup arriving after the second reading went out holds it")
	}
	_, sent, err := second.await(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	// The proxy holds the first reading's answer back by delay.
	if gap := sent.Sub(firstSent); gap < delay {
		t.Errorf("the second reading was sent %v after the first: before the first answered", gap)
	}
	// Once the second has answered, the fence stops: nothing asked for the third.
	testenv.Eventually(t, 5*time.Second, "the fence's reader stopping", func() bool {
		sending, _ := inFlight(third)
		return !sending
	})
	if _, sent := inFlight(third); sent {
		t.Error("a reading no batch asked for was sent")
	}
	if n := f.readings.Load(); n != 2 {
		t.Errorf("%d readings sent; want 2: the third is held, never asked for", n)
	}
	select {
	case <-third.done:
		t.Error("a reading no batch asked for answered")
	default:
	}
}

// TestFenceReadsARunOnOneConnection: the readings of a run, each asked for while the
// one before was in flight, share one connection of the pool, acquired once. A reading
// whose connection was closed under it is tried again on another, and answers.
func TestFenceReadsARunOnOneConnection(t *testing.T) {
	slow, direct := slowPool(t, 100*time.Millisecond)
	f := newFence(slow, 5*time.Second)
	ctx := context.Background()
	acquired := slow.Stat().AcquireCount()

	// run sends n readings, each asked for while the one before is in flight, then
	// waits for the fence to stop. cut, when set, runs while the second is in flight.
	run := func(n int, cut func()) {
		t.Helper()
		r := f.hold()
		r.send()
		for i := 1; i <= n; i++ {
			// r goes out as the one before answers; only then is the next one new.
			testenv.Eventually(t, 5*time.Second, "the reading going out", func() bool {
				f.mu.Lock()
				defer f.mu.Unlock()
				return !r.sent.IsZero()
			})
			var next *reading
			if i < n {
				next = f.hold()
				next.send() // asked for while r is in flight
			}
			if i == 2 && cut != nil {
				cut()
			}
			if _, _, err := r.await(ctx, time.Now().Add(5*time.Second)); err != nil {
				t.Fatalf("reading %d of %d: %v", i, n, err)
			}
			r = next
		}
		testenv.Eventually(t, 5*time.Second, "the fence's reader stopping", func() bool {
			f.mu.Lock()
			defer f.mu.Unlock()
			return !f.sending
		})
	}

	run(5, nil)
	if n := slow.Stat().AcquireCount() - acquired; n != 1 {
		t.Errorf("a run of 5 readings acquired %d connections; want 1", n)
	}

	// The backend of the fence's connection is ended while the run goes on: the next
	// reading fails on it, and is tried again on a connection acquired anew.
	acquired = slow.Stat().AcquireCount()
	run(4, func() {
		var ended int
		err := direct.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000)) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND query = $1`, insertSQL).Scan(&ended)
		if err != nil || ended != 1 {
			t.Fatalf("ending the fence's backend: %d ended, %v", ended, err)
		}
	})
	if n := slow.Stat().AcquireCount() - acquired; n != 2 {
		t.Errorf("a run of 4 readings whose connection was cut acquired %d connections; want 2", n)
	}
}

// TestReadInsertReadsThePositionInEveryExecMode: the insert position read on the
// wire, in the modes that prepare statements, or through QueryRow in those that do
// not, lies between two readings of it taken before and after.
func TestReadInsertReadsThePositionInEveryExecMode(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	ctx := context.Background()
	position := func() int64 {
		t.Helper()
		var insert int64
		if err := pool.QueryRow(ctx, insertSQL).Scan(&insert); err != nil {
			t.Fatal(err)
		}
		return insert
	}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeCacheDescribe,
		pgx.QueryExecModeDescribeExec, pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		t.Run(mode.String(), func(t *testing.T) {
			cfg := pool.Config().ConnConfig.Copy()
			cfg.DefaultQueryExecMode = mode
			conn, err := pgx.ConnectConfig(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close(ctx)
			for range 2 { // the second on the statement prepared by the first
				before := position()
				got, err := readInsert(ctx, conn)
				after := position()
				if err != nil || got < before || got > after || got == 0 {
					t.Fatalf("readInsert = %d, %v; want a position from %d to %d", got, err, before, after)
				}
				if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, 'keygate', 'test')"); err != nil {
					t.Fatal(err) // moves the insert position on
				}
			}
		})
	}
}

// BenchmarkFenceRead reports the gateway's CPU for one reading of the primary's insert
// position: "pool" as a query of the pool, which acquires and releases a connection
// each time, and "held" as the fence reads in a run, on one connection it holds.
func BenchmarkFenceRead(b *testing.B) {
	pool, _ := schematest.NewPool(b)
	ctx := context.Background()
	b.Run("pool", func(b *testing.B) {
		benchcpu.Loop(b, func() {
			var insert int64
			if err := pool.QueryRow(ctx, insertSQL).Scan(&insert); err != nil {
				b.Fatal(err)
			}
		}, benchcpu.Self())
	})
	b.Run("held", func(b *testing.B) {
		f := newFence(pool, 5*time.Second)
		var conn *pgxpool.Conn
		defer func() { conn.Release() }()
		benchcpu.Loop(b, func() {
			if _, err := f.query(ctx, &conn); err != nil {
				b.Fatal(err)
			}
		}, benchcpu.Self())
	})
}

// slowPool returns a pool on a fresh test database, reached through a proxy that
// holds every reply back by delay, and a pool reaching the same database directly.
func slowPool(t testing.TB, delay time.Duration) (slow, direct *pgxpool.Pool) {
	t.Helper()
	direct, u := schematest.NewPool(t)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	schematest.Proxied(t, cfg).SetDelay(delay)
	return schematest.OpenPool(t, cfg), direct
}
