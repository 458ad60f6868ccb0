package keystore

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

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
	f := newFence(slowPool(t, delay), 5*time.Second)
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

// TestFenceTriesAFailedReadingAgain: a reading on a connection that is closed, as a
// restart of the primary closes every idle one, is tried once more on another
// connection, and answers.
func TestFenceTriesAFailedReadingAgain(t *testing.T) {
	pool, _ := schematest.NewPool(t)
	f := newFence(pool, 5*time.Second)
	ctx := context.Background()
	read := func() error {
		t.Helper()
		_, _, err := f.wait(ctx, time.Now().Add(5*time.Second))
		return err
	}
	if err := read(); err != nil {
		t.Fatal(err)
	}
	if idle := pool.Stat().IdleConns(); idle != 1 {
		t.Fatalf("%d idle connections in the fence's pool; want 1, the reading's", idle)
	}
	// Its socket closes under pgx, which learns of it on its next query, as of a
	// restarted server's. The pool keeps it, since pgx takes it for open; the next
	// reading takes it.
	c, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Conn().PgConn().Conn().Close(); err != nil {
		t.Fatal(err)
	}
	c.Release()
	if err := read(); err != nil {
		t.Errorf("a reading on a closed connection: %v", err)
	}
	if n := f.readings.Load(); n != 2 {
		t.Errorf("%d readings sent; want 2", n)
	}
}

// slowPool returns a pool on a fresh test database, reached through a proxy that
// holds every reply back by delay.
func slowPool(t *testing.T, delay time.Duration) *pgxpool.Pool {
	t.Helper()
	_, u := schematest.NewPool(t)
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	schematest.Proxied(t, cfg).SetDelay(delay)
	return schematest.OpenPool(t, cfg)
}
