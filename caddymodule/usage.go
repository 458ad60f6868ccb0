package caddymodule

import (
	"context"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
)

// minUsageFlushInterval is the shortest usage_flush_interval: each flush is one
// INSERT, which a shorter interval would send more often than it is worth.
const minUsageFlushInterval = time.Second

// usageRecorder counts the answered requests of identified keys; a *keystore.Usage
// does, in memory, and writes the counts to PostgreSQL later (docs/operations.md,
// Usage).
type usageRecorder interface {
	Record(orgID, keyID string, at time.Time, outcome keystore.Outcome, status int)
}

// countUsage counts a request of key answered with status in the usage record. It is
// in memory and never waits on the database.
func (h *Handler) countUsage(key *keystore.Key, outcome keystore.Outcome, status int) {
	if h.usage != nil {
		h.usage.Record(key.OrgID, key.ID, time.Now(), outcome, status)
	}
}

// countDecided counts a request of key that ServeHTTP answers itself with outcome o,
// with the status answer writes: o's own. A proxied request has no fixed status:
// countProxied counts it with the status the client got.
func (h *Handler) countDecided(key *keystore.Key, o keystore.Outcome) {
	if status := o.Status(); status != 0 && o.Recorded() {
		h.countUsage(key, o, status)
	}
}

// countProxied counts a proxied request once its answer is over, with the status the
// client got (proxyWriter.sentStatus). ServeHTTP defers it, so that a response the
// reverse proxy aborts mid-body (a panic) is counted too.
func (h *Handler) countProxied(key *keystore.Key, pw *proxyWriter) {
	h.countUsage(key, keystore.OutcomeProxied, pw.sentStatus())
}

// sentStatus returns the status of the response pw wrote: the upstream's, or the
// module's own that replaced it (writeError). A next handler that returned without
// writing gets the server's 200.
func (pw *proxyWriter) sentStatus() int {
	if pw.mode == modeUndecided || pw.status == 0 {
		return http.StatusOK
	}
	return pw.status
}

// usageEntry is a keystore.Usage in pools, with the goroutine that flushes it. It is
// shared by every handler with the same PostgreSQL pool, usage_flush_interval,
// usage_buffer and metrics setting, across config reloads, so that a reload neither
// loses the counts held so far nor starts a second flusher. When its last handler
// goes (a reload that changes one of those settings, or a stop), Destruct writes what
// it holds.
//
// It writes through that PostgreSQL pool without a reference of its own: its key
// names the pool's, every handler holding the entry holds that pool too, and gives
// the entry back before the pool (Cleanup goes through poolKeys backwards), so the
// last flush still has its pool.
type usageEntry struct {
	u    *keystore.Usage
	log  *atomic.Pointer[zap.Logger] // the newest config's logger, for the flusher's lines
	stop context.CancelFunc
	done <-chan struct{}
}

// Destruct stops the flusher after one last flush, bounded by the flush timeout (the
// interval, at most 10s).
func (e usageEntry) Destruct() error {
	e.stop()
	<-e.done
	return nil
}

func usageKey(pgKey string, interval time.Duration, buffer int, withMetrics bool) string {
	return "usage\x00" + pgKey + "\x00" + interval.String() + "\x00" + strconv.Itoa(buffer) + "\x00" + strconv.FormatBool(withMetrics)
}

// loadUsage returns the shared usage recorder of h's options, writing through pool
// (h's, from loadPostgres, held in pools under pgKey), starting its flusher if needed,
// and the key to give back to pools.
func (h *Handler) loadUsage(pool *pgxpool.Pool, pgKey string) (*keystore.Usage, string) {
	interval := time.Duration(h.UsageFlushInterval)
	m := h.metrics
	key := usageKey(pgKey, interval, h.UsageBuffer, m != nil)
	v, _, _ := pools.LoadOrNew(key, func() (caddy.Destructor, error) {
		e := usageEntry{log: new(atomic.Pointer[zap.Logger])}
		e.log.Store(h.logger)
		var lines usageLog
		opts := keystore.UsageOptions{
			Interval:   interval,
			MaxPending: h.UsageBuffer,
			OnFlush: func(rows int, err error) {
				if err != nil && m != nil {
					m.usageFlushErrors.Inc()
				}
				lines.flushed(e.log.Load(), rows, err)
			},
			OnDrop: func(requests int) {
				lines.dropped.Add(int64(requests))
				if m != nil {
					m.usageDropped.Add(float64(requests))
				}
			},
		}
		e.u = keystore.NewUsage(pool, opts)
		ctx, stop := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.u.Run(ctx)
		}()
		e.stop, e.done = stop, done
		return e, nil
	})
	e := v.(usageEntry)
	e.log.Store(h.logger)
	return e.u, key
}

// usageLog logs the flusher's failed writes and the requests dropped, at most once a
// minute, with how many since the last line: PostgreSQL down fails every flush.
type usageLog struct {
	dropped atomic.Int64 // requests dropped since the last line; Record's callers add
	// Only the flusher's goroutine uses the fields below.
	last   time.Time
	failed int
}

// flushed notes the outcome of a flush of rows.
func (l *usageLog) flushed(logger *zap.Logger, rows int, err error) {
	if err != nil {
		l.failed++
	}
	if time.Since(l.last) < time.Minute {
		return
	}
	switch {
	case err != nil:
		logger.Warn("writing the usage record failed; its counts are held for the next flush, up to usage_buffer rows (no request waits for it)",
			zap.Int("rows", rows), zap.Int("failed_flushes", l.failed), zap.Int64("dropped_requests", l.dropped.Swap(0)), zap.Error(err))
	case l.dropped.Load() > 0:
		logger.Warn("the usage record dropped requests: usage_buffer rows were held",
			zap.Int("failed_flushes", l.failed), zap.Int64("dropped_requests", l.dropped.Swap(0)))
	default:
		return
	}
	l.last, l.failed = time.Now(), 0
}
