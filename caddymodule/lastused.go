package caddymodule

import (
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/keystore"
)

// minLastUsedInterval is the shortest last_used_interval. It is short enough for
// tests, and long enough that the flushes stay batches.
const minLastUsedInterval = time.Second

// recorder notes that a key was used. A *keystore.LastUsed notes it in memory, and
// writes last_used_at later.
type recorder interface{ Record(keyID string) }

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
		log := newFlushLog(h.logger, "writing last_used_at failed; the ids are kept for the next flush (no request waits for it)", "ids", "")
		opts := keystore.LastUsedOptions{
			Interval: interval,
			OnFlush: func(ids int, err error) {
				if err != nil && m != nil {
					m.lastUsedFlushErrors.Inc()
				}
				log.flushed(ids, err)
			},
		}
		if m != nil {
			opts.OnDrop = m.lastUsedDropped.Inc
		}
		lu := keystore.NewLastUsed(pool, opts)
		return startFlusher(lu, log, lu.Run), nil
	})
	e := v.(flusherEntry)
	e.log.logger.Store(h.logger)
	return e.rec.(*keystore.LastUsed), key
}
