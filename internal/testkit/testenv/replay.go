package testenv

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// WaitForReplay waits until the standby at standbyURL has replayed everything the
// primary at primaryURL had flushed when it was called, for at most within, and logs
// the wait when it is long.
//
// WaitForReplay exists because a standby can be many seconds behind when a test
// starts: make test's earlier stages and the packages running beside a test write far
// faster than a standby on a small machine replays. The fence rightly keeps every
// lookup off a standby that far behind, so a test that needs a standby to answer
// first waits for the backlog to drain, rather than counting it against its own
// deadlines. The flush position, unlike the insert position the fence reads, is
// never past what a standby can receive.
func WaitForReplay(tb testing.TB, primaryURL, standbyURL string, within time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	var target int64
	if err := queryOnce(ctx, primaryURL, `SELECT (pg_current_wal_flush_lsn() - '0/0')::int8`, &target); err != nil {
		tb.Fatalf("reading the primary's WAL position: %v", err)
	}
	start := time.Now()
	var replayed int64
	for {
		err := queryOnce(ctx, standbyURL, `SELECT coalesce((pg_last_wal_replay_lsn() - '0/0')::int8, -1)`, &replayed)
		if err == nil && replayed >= target {
			break
		}
		if ctx.Err() != nil {
			tb.Fatalf("the standby has not replayed the primary's WAL within %v: %d bytes behind (last error: %v)",
				within, target-replayed, err)
		}
		time.Sleep(50 * time.Millisecond) // a poll of another process's progress: no event to wait on
	}
	if d := time.Since(start); d > time.Second {
		tb.Logf("the standby took %v to replay the primary's WAL", d.Round(time.Millisecond))
	}
}

// queryOnce scans the one value of sql on a connection of its own to url.
func queryOnce(ctx context.Context, url, sql string, dest any) error {
	c, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer c.Close(context.Background())
	return c.QueryRow(ctx, sql).Scan(dest)
}
