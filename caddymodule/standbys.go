package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/caddymodule/spans"
	"github.com/keygate/keygate/internal/flaplog"
	"github.com/keygate/keygate/keystore"
)

// This file holds the key lookups on hot standbys (database_read_urls): their
// options' checks and the keystore.Reader that spreads the lookups over them.

// validateReads checks database_read_urls and database_read_max_lag.
func (h *Handler) validateReads() error {
	if h.DatabaseReadMaxLag < 0 {
		return fmt.Errorf("database_read_max_lag %s: must be positive", time.Duration(h.DatabaseReadMaxLag))
	}
	if len(h.DatabaseReadURLs) > 0 && h.DisableLookupBatching {
		return errors.New("database_read_urls needs batched lookups: remove disable_lookup_batching")
	}
	for i, u := range h.readURLs {
		if strings.TrimSpace(u) == "" {
			return fmt.Errorf("database_read_urls %q is empty once its placeholders are replaced (is the environment variable set?)", h.DatabaseReadURLs[i])
		}
		if u == h.databaseURL {
			return errors.New("database_read_urls: a standby's URL is database_url's; name the primary in database_url only")
		}
	}
	return nil
}

// readerEntry is a shared keystore.Reader in pools. Its standbys' health carries
// across config reloads, so a reload does not send every lookup to the primary
// until the probes have run. Its standbys' keygate_standby_up go with it.
type readerEntry struct {
	r     *keystore.Reader
	hosts []string
	m     *metrics
}

func (e readerEntry) Destruct() error {
	e.r.Close()
	for _, host := range e.hosts {
		if e.m != nil {
			e.m.standbyUp.DeleteLabelValues(host)
		}
	}
	return nil
}

// standbyLog logs a standby joining and leaving the lookups: a change at once, then
// at most once a minute while the standby keeps crossing database_read_max_lag, with
// the number of changes, at warn unless it is in after a single change.
func standbyLog(logger *zap.Logger, host string) *flaplog.Log {
	return flaplog.New(false, time.Minute, func(in bool, changes int) {
		level, msg := zapcore.WarnLevel, "standby left out of key lookups: down, or behind by more than database_read_max_lag"
		if in {
			msg = "standby takes key lookups"
		}
		if in && changes == 1 {
			level = zapcore.InfoLevel
		}
		logger.Log(level, msg, zap.String("standby", host), zap.Int("changes", changes))
	})
}

// provisionReads takes a pool for each of database_read_urls and returns the shared
// Reader over them, with primary answering what no standby can. primaryKey is the
// pools key of primaryPool. Every setting the Reader is built with is in its key.
func (h *Handler) provisionReads(primary *keystore.Batcher, primaryPool *pgxpool.Pool, primaryKey string, opts keystore.BatcherOptions) (*keystore.Reader, error) {
	pgSetup := conns.Setup{DialTimeout: time.Duration(h.DatabaseDialTimeout), MinConns: h.DatabaseMinConns}
	key := []string{"reader", primaryKey, time.Duration(h.DatabaseReadMaxLag).String(), time.Duration(h.DatabaseTimeout).String(),
		fmt.Sprint(opts.Lanes, opts.Linger, h.metrics != nil, h.KeyPrefix, h.LegacyKeys)}
	var standbys []*pgxpool.Pool
	for _, u := range h.readURLs {
		pool, k, err := loadPostgres(u, "database_read_urls", time.Duration(h.DatabaseTimeout), pgSetup, h.logger)
		if err != nil {
			return nil, err
		}
		h.poolKeys = append(h.poolKeys, k)
		standbys = append(standbys, pool)
		key = append(key, k)
	}
	readerKey := strings.Join(key, "\x01")
	logger := h.logger
	hosts := make([]string, len(h.readURLs))
	logs := make([]*flaplog.Log, len(h.readURLs))
	for i, u := range h.readURLs {
		hosts[i] = standbyHost(u)
		logs[i] = standbyLog(logger, hosts[i])
	}
	m := h.metrics
	v, _, err := pools.LoadOrNew(readerKey, func() (caddy.Destructor, error) {
		ro := keystore.ReaderOptions{
			Batcher:      opts,
			MaxLag:       time.Duration(h.DatabaseReadMaxLag),
			ProbeTimeout: time.Duration(h.DatabaseDialTimeout + h.DatabaseTimeout),
			OnStandby: func(i int, in bool) {
				m.standbyIn(hosts[i], in)
				logs[i].Change(in)
			},
		}
		ro.OnLookup = spans.LookupServer
		if m != nil {
			ro.OnLookup = func(ctx context.Context, standby bool) {
				spans.LookupServer(ctx, standby)
				m.observeLookupServer(standby)
			}
			ro.OnFenceWait = m.observeFenceWait
			ro.OnReplayWait = m.observeReplayWait
		}
		for _, host := range hosts {
			m.standbyIn(host, false) // out until its first probe
		}
		return readerEntry{keystore.NewReader(primary, primaryPool, standbys, ro), hosts, m}, nil
	})
	if err != nil {
		return nil, err
	}
	h.poolKeys = append(h.poolKeys, readerKey)
	return v.(readerEntry).r, nil
}

// standbyHost is the host and port of a standby's URL, for logs: never its password.
// A keyword/value string is not parsed; it logs as "standby".
func standbyHost(u string) string {
	if p, err := url.Parse(u); err == nil && p.Host != "" {
		return p.Host
	}
	return "standby"
}
