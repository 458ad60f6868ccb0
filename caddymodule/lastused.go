package caddymodule

import (
	"context"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
)

// minLastUsedInterval is the shortest last_used_interval. It is short enough for
// tests, and long enough that the flushes stay batches.
const minLastUsedInterval = time.Second

// recorder notes that a key was used. A *keystore.LastUsed notes it in memory, and
// writes last_used_at later.
type recorder interface{ Record(keyID string) }

// lastUsedEntry is a keystore.LastUsed in pools, with the goroutine that flushes it.
// Every handler with the same database_url, last_used_interval and metrics setting
// shares it, across config reloads. So a reload neither loses the ids noted so far
// nor starts a second flusher.
//
// It writes through the PostgreSQL pool of the same database_url, without a
// reference of its own. Every handler holding the entry holds that pool too. It
// gives the entry back before the pool: Cleanup goes through poolKeys backwards. So
// the last flush, when the last such handler goes, still has its pool.
type lastUsedEntry struct {
	lu     *keystore.LastUsed
	logger *atomic.Pointer[zap.Logger] // the logger of the newest config using it
	stop   context.CancelFunc
	done   <-chan struct{}
}

// Destruct stops the flusher after one last flush, bounded by the flush timeout.
func (e lastUsedEntry) Destruct() error {
	e.stop()
	<-e.done
	return nil
}

func lastUsedKey(url string, interval time.Duration, withMetrics bool) string {
	return "lastused\x00" + url + "\x00" + interval.String() + "\x00" + strconv.FormatBool(withMetrics)
}

// loadLastUsed returns the shared recorder of h's database and interval, and the key
// to give back to pools. The recorder writes through pool, h's. loadLastUsed starts
// its flusher if needed.
func (h *Handler) loadLastUsed(pool *pgxpool.Pool) (recorder, string) {
	interval := time.Duration(h.LastUsedInterval)
	m := h.metrics
	key := lastUsedKey(h.databaseURL, interval, m != nil)
	v, _, _ := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		logger := new(atomic.Pointer[zap.Logger])
		logger.Store(h.logger)
		var failures flushFailures
		opts := keystore.LastUsedOptions{
			Interval: interval,
			OnFlush: func(ids int, err error) {
				if err == nil {
					return
				}
				if m != nil {
					m.lastUsedFlushErrors.Inc()
				}
				failures.log(logger.Load(), ids, err)
			},
		}
		if m != nil {
			opts.OnDrop = m.lastUsedDropped.Inc
		}
		lu := keystore.NewLastUsed(pool, opts)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			lu.Run(ctx)
		}()
		return lastUsedEntry{lu: lu, logger: logger, stop: stop, done: done}, nil
	})
	e := v.(lastUsedEntry)
	e.logger.Store(h.logger)
	return e.lu, key
}

// flushFailures logs failed flushes at most once a minute, with how many failed
// since the last line. Only the flusher's goroutine uses it.
type flushFailures struct {
	last   time.Time
	failed int
}

func (f *flushFailures) log(logger *zap.Logger, ids int, err error) {
	f.failed++
	if time.Since(f.last) < time.Minute {
		return
	}
	logger.Warn("writing last_used_at failed; the ids are kept for the next flush (no request waits for it)",
		zap.Int("ids", ids), zap.Int("failed_flushes", f.failed), zap.Error(err))
	f.last, f.failed = time.Now(), 0
}
