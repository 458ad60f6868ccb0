package caddymodule

import (
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
)

// minUsageFlushInterval is the shortest usage_flush_interval: each flush is one
// INSERT, which a shorter interval would send more often than it is worth.
const minUsageFlushInterval = time.Second

// usageRecorder counts the answered requests of identified keys; a *keystore.Usage
// does, in memory, and writes the counts to PostgreSQL later (docs/operations.md,
// Usage).
type usageRecorder interface {
	Record(orgID, keyID string, at time.Time, outcome keystore.Outcome, status int, units int)
}

// countUsage counts a request of key answered with status, weighing units (its
// route's cost), in the usage record. It is in memory and never waits on the database.
func (h *Handler) countUsage(key *keystore.Key, outcome keystore.Outcome, status, units int) {
	h.countUsageAt(key, outcome, status, units, now())
}

// countUsageAt is countUsage of a request answered at at, counted later.
func (h *Handler) countUsageAt(key *keystore.Key, outcome keystore.Outcome, status, units int, at time.Time) {
	if h.usage != nil {
		h.usage.Record(key.OrgID, key.ID, at, outcome, status, units)
	}
}

// countDecided counts a request of key, weighing units, that ServeHTTP answers itself
// with outcome o, with the status answer writes: o's own. A proxied request has no
// fixed status: countProxied counts it with the status the client got.
func (h *Handler) countDecided(key *keystore.Key, o keystore.Outcome, units int) {
	if status := o.Status(); status != 0 && o.Recorded() {
		h.countUsage(key, o, status, units)
	}
}

// countProxied counts a proxied request once its answer is over, with the status the
// client got (proxyWriter.sentStatus). ServeHTTP defers it, so that a response the
// reverse proxy aborts mid-body (a panic) is counted too.
func (h *Handler) countProxied(key *keystore.Key, pw *proxyWriter, units int) {
	h.countUsage(key, keystore.OutcomeProxied, pw.sentStatus(), units)
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
		log := newFlushLog(h.logger,
			"writing the usage record failed; its counts are held for the next flush, up to usage_buffer rows (no request waits for it)", "rows",
			"the usage record dropped requests: usage_buffer rows were held")
		opts := keystore.UsageOptions{
			Interval:   interval,
			MaxPending: h.UsageBuffer,
			OnFlush: func(rows int, err error) {
				if err != nil && m != nil {
					m.usageFlushErrors.Inc()
				}
				log.flushed(rows, err)
			},
			OnDrop: func(requests int) {
				log.dropped.Add(int64(requests))
				if m != nil {
					m.usageDropped.Add(float64(requests))
				}
			},
		}
		u := keystore.NewUsage(pool, opts)
		return startFlusher(u, log, u.Run), nil
	})
	e := v.(flusherEntry)
	e.log.logger.Store(h.logger)
	return e.rec.(*keystore.Usage), key
}
