package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/caddymodule/spans"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// This file holds the request path's two dependencies, behind one wrapper:
// PostgreSQL's key lookups (lookups, step 2) and Redis's counts (counts, step 4).
// The wrapper, dependency, puts every call behind the dependency's circuit breaker
// and times the request's wait. The breaker keeps keygate_dependency_up and answers
// keygate_health (watch). Provision builds both here.

// dependency is what the request path puts around every call to a dependency. Its
// methods are called in this order: start, allow, done (if allowed), observe.
type dependency struct {
	breaker  *conns.Breaker       // nil: calls always go through (the in-process limiter)
	waited   prometheus.Histogram // the request's wait; nil without metrics
	failures prometheus.Counter   // calls that failed; nil where they are not counted
}

// start returns when a call starts. Without metrics it is the zero time, and the
// clock is not read.
func (d *dependency) start() time.Time {
	if d.waited == nil {
		return time.Time{}
	}
	return time.Now()
}

// allow reports whether the breaker lets a call through. A call let through must be
// followed by exactly one done. A call refused fails with conns.ErrBreakerOpen.
func (d *dependency) allow() bool {
	return d.breaker == nil || d.breaker.Allow()
}

// done tells the breaker what a call made under the request's context ctx came to.
func (d *dependency) done(ctx context.Context, err error) {
	if d.breaker != nil {
		d.breaker.Done(resultOf(ctx, err))
	}
}

// observe records a call begun at start that ended in err: the wait and the
// failure. It does nothing without metrics.
func (d *dependency) observe(start time.Time, err error) {
	if d.waited == nil {
		return
	}
	d.waited.Observe(time.Since(start).Seconds())
	if err != nil && d.failures != nil {
		d.failures.Inc()
	}
}

// resultOf tells a breaker what a call under the request's context ctx came to. A
// client that went away says nothing about the dependency.
func resultOf(ctx context.Context, err error) conns.CallResult {
	switch {
	case err == nil:
		return conns.CallSucceeded
	case ctx.Err() != nil:
		return conns.CallIgnored
	}
	return conns.CallFailed
}

// lookups are the request path's PostgreSQL: each key lookup goes through verifier,
// behind PostgreSQL's breaker. A key the lookup refused is looked at again through
// denials, after its answer (refuseLookedUp).
type lookups struct {
	dep      dependency
	verifier Verifier
	denials  Denier // nil: a refused key is never recorded as ip_denied
	standbys bool   // verifier is a keystore.Reader, which tells the span its server
}

// Denier tells whether a key its lookup refused was refused for its address: a live
// key with that secret and allowed networks, whose ID and OrgID the Key holds. It is
// a keystore.Denials. It bounds each look's wait itself.
type Denier interface {
	Denied(ctx context.Context, keyID, secret string) (keystore.Key, bool, error)
}

func newLookups(v Verifier, b *conns.Breaker, m *metrics) lookups {
	l := lookups{dep: dependency{breaker: b}, verifier: v}
	if m != nil {
		l.dep.waited = m.lookupDuration
	}
	return l
}

// verify looks the key up, unless the breaker is open. The verifier bounds the wait
// by database_timeout itself.
func (l *lookups) verify(ctx context.Context, keyID, secret string, from netip.Addr) (key keystore.Key, ok bool, err error) {
	start, wait := l.dep.start(), spans.Start(ctx, spans.Lookup)
	if l.dep.allow() {
		key, ok, err = l.verifier.VerifyParsed(ctx, keyID, secret, from)
		l.dep.done(ctx, err)
	} else {
		err = conns.ErrBreakerOpen
	}
	if err == nil && !l.standbys {
		wait.Served(false)
	}
	wait.End(err)
	l.dep.observe(start, err)
	return key, ok, err
}

// denied tells whether a key its lookup refused was refused for its address. It is
// asked after the answer, so it is not timed as a lookup, and it tells the breaker
// nothing: a failure is the next lookup's to find. It asks nothing while the breaker
// is not closed. A client that goes away does not cut it short: its owner should
// still see the refusal.
func (l *lookups) denied(ctx context.Context, keyID, secret string) (keystore.Key, bool) {
	if l.denials == nil || (l.dep.breaker != nil && !l.dep.breaker.Closed()) {
		return keystore.Key{}, false
	}
	key, ok, err := l.denials.Denied(context.WithoutCancel(ctx), keyID, secret)
	return key, ok && err == nil
}

// counts are the request path's Redis: each rate-limit count goes through lim,
// behind Redis's breaker. Without redis_url, lim is the in-process limiter, with no
// breaker and no gauge.
type counts struct {
	dep    dependency
	lim    limiter.Limiter
	warmer *conns.RedisWarmer // kicked when a count fails; nil in process
}

// redisCounts are the counts of a Redis limiter. lim bounds each count by
// redis_timeout itself (limiter.WithTimeout).
func redisCounts(lim limiter.Limiter, b *conns.Breaker, w *conns.RedisWarmer, m *metrics) counts {
	c := counts{dep: dependency{breaker: b}, lim: lim, warmer: w}
	if m != nil {
		c.dep.waited, c.dep.failures = m.limiterDuration, m.limiterErrors
	}
	return c
}

// localCounts are the counts of the in-process limiter.
func localCounts(lim limiter.Limiter, m *metrics) counts {
	c := counts{lim: lim}
	if m != nil {
		c.dep.waited, c.dep.failures = m.limiterDuration, m.limiterErrors
	}
	return c
}

// allow counts one request against b, unless the breaker is open. A month whose
// count could not be read from the usage record is PostgreSQL's failure, not Redis's:
// Redis answered, so its breaker and gauge take it as a success.
func (c *counts) allow(ctx context.Context, b limiter.Budgets) (res limiter.Result, err error) {
	start, wait := c.dep.start(), spans.Start(ctx, spans.Count)
	redisErr := conns.ErrBreakerOpen
	if c.dep.allow() {
		res, err = c.lim.Allow(ctx, b)
		redisErr = err
		if err != nil && errors.Is(err, limiter.ErrMonthSeed) {
			redisErr = nil
		}
		c.dep.done(ctx, redisErr)
		if redisErr != nil && c.warmer != nil {
			c.warmer.Kick()
		}
	} else {
		err = conns.ErrBreakerOpen
	}
	wait.End(err)
	c.dep.observe(start, redisErr)
	return res, err
}

// provisionLookups takes the shared PostgreSQL pool and builds the lookups on it:
// batched (keystore.Batcher), or one query per request with disable_lookup_batching
// (storeWithin); with database_read_urls, on the standbys first (standbys.go). It
// returns the pool and its pools key, for what else writes to the database.
func (h *Handler) provisionLookups() (*pgxpool.Pool, string, error) {
	pgSetup := conns.Setup{DialTimeout: time.Duration(h.DatabaseDialTimeout), MinConns: h.DatabaseMinConns}
	pool, key, err := loadPostgres(h.databaseURL, "database_url", time.Duration(h.DatabaseTimeout), pgSetup, h.logger)
	if err != nil {
		return nil, "", err
	}
	h.poolKeys = append(h.poolKeys, key)
	store := keystore.New(pool, h.format)
	var v Verifier = storeWithin{store, time.Duration(h.DatabaseTimeout)}
	if !h.DisableLookupBatching {
		// Timeout bounds both a request's wait and the batch's query. The query
		// serves many requests, so it runs under none of their contexts: a request
		// giving up must not cancel the others' query.
		opts := keystore.BatcherOptions{
			Lanes:   h.LookupLanes,
			Timeout: time.Duration(h.DatabaseTimeout),
			Linger:  time.Duration(h.BatchLinger),
		}
		if h.metrics != nil {
			opts.OnBatch = h.metrics.observeBatch
		}
		b := keystore.NewBatcher(store, opts)
		v = b
		if len(h.readURLs) > 0 {
			if v, err = h.provisionReads(b, pool, key, opts); err != nil {
				return nil, "", err
			}
		}
	}
	probe := conns.PostgresProbe(pool, time.Duration(h.DatabaseDialTimeout+h.DatabaseTimeout))
	pb := conns.NewBreaker(probe, h.breakerChanged("postgres"))
	pb.Spacing = conns.BreakerSpacing(time.Duration(h.DatabaseTimeout))
	h.watch("postgres", key, pb, conns.PostgresPing(pool, time.Duration(h.DatabaseDialTimeout+h.DatabaseTimeout)))
	h.lookups = newLookups(v, pb, h.metrics)
	h.lookups.standbys = len(h.readURLs) > 0
	h.lookups.denials = keystore.NewDenials(store, time.Duration(h.DatabaseTimeout))
	return pool, key, nil
}

// provisionCounts takes the shared Redis client and builds the counts on it, or on
// the shared in-process limiter without redis_url. An organisation's month that
// Redis lost starts again from seed, its count in the usage record
// (docs/operations.md, An organisation's budgets).
func (h *Handler) provisionCounts(seed limiter.MonthSeed) error {
	if h.redisURL == "" {
		lim, key := loadLocalLimiter()
		h.poolKeys = append(h.poolKeys, key)
		h.counts = localCounts(lim, h.metrics)
		return nil
	}
	setup := conns.Setup{DialTimeout: time.Duration(h.RedisDialTimeout), MinConns: h.RedisMinConns}
	rd, key, err := loadRedis(h.RedisMode, h.redisURL, h.RedisTLSCA, time.Duration(h.RedisTimeout), setup, h.logger)
	if err != nil {
		return err
	}
	h.poolKeys = append(h.poolKeys, key)
	opts := []limiter.Option{limiter.WithTimeout(time.Duration(h.RedisTimeout)), limiter.WithMonthSeed(seed)}
	if !h.DisableCountPipelining {
		opts = append(opts, limiter.WithPipelining(time.Duration(h.RedisTimeout)), limiter.WithLinger(time.Duration(h.BatchLinger)))
	}
	lim := limiter.NewRedis(rd.client, opts...)
	budget := time.Duration(h.RedisDialTimeout + h.RedisTimeout)
	b := conns.NewBreaker(conns.RedisProbe(rd.warmer, lim, budget), h.breakerChanged("redis"))
	b.Spacing = conns.BreakerSpacing(time.Duration(h.RedisTimeout))
	h.watch("redis", key, b, conns.RedisPing(rd.warmer, budget))
	h.counts = redisCounts(lim, b, rd.warmer, h.metrics)
	if h.failMode == failLocal {
		h.fallback = limiter.NewLocal(limiter.WithMonthSeed(seed), limiter.WithClock(clock))
	}
	// The scripts and Redis's clock are read before the first count needs them. A
	// Redis that does not answer now is prepared by the breaker's probe later.
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		_ = lim.Prepare(ctx)
	}()
	return nil
}

// monthSeed returns the month's count of an organisation in the usage record, from
// used, bounded by database_timeout: the limiter runs it under no request's deadline.
func (h *Handler) monthSeed(used limiter.MonthSeed) limiter.MonthSeed {
	timeout := time.Duration(h.DatabaseTimeout)
	return func(ctx context.Context, org string, month time.Time) (int64, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		return used(ctx, org, month)
	}
}

// storeWithin is the Verifier of disable_lookup_batching: a Store whose every lookup
// is bounded by database_timeout, as a Batcher's are by its Timeout.
type storeWithin struct {
	store   *keystore.Store
	timeout time.Duration
}

func (s storeWithin) VerifyParsed(ctx context.Context, keyID, secret string, from netip.Addr) (keystore.Key, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.store.VerifyParsed(ctx, keyID, secret, from)
}

// watch has b, the breaker of dependency, keep its keygate_dependency_up and answer
// keygate_health for this process (conns.Watch) until h is cleaned up. poolKey is
// the key of its connections in pools; ping is b's Ping.
func (h *Handler) watch(dependency, poolKey string, b *conns.Breaker, ping func() bool) {
	b.Ping = ping
	if h.metrics != nil {
		b.OnUp = h.metrics.dependency(dependency).setUp
	}
	key := fmt.Sprintf("watch\x00%p", b)
	_, _, _ = pools.LoadOrNew(key, func() (caddy.Destructor, error) { return conns.Watch(dependency, poolKey, b), nil })
	h.poolKeys = append(h.poolKeys, key)
}

// breakerChanged returns the hook of a dependency's breaker, which logs the breaker
// opening and closing.
func (h *Handler) breakerChanged(dependency string) func(from, to conns.BreakerState) {
	return func(from, to conns.BreakerState) {
		switch {
		case to == conns.BreakerOpen && from == conns.BreakerClosed:
			h.logger.Warn("circuit breaker open: answering at once without waiting on the dependency",
				zap.String("dependency", dependency))
		case to == conns.BreakerClosed:
			h.logger.Info("circuit breaker closed: the dependency answers again",
				zap.String("dependency", dependency))
		}
	}
}

// lookupFailed logs a key lookup that PostgreSQL could not answer, at most once a
// second: a dead database fails every request.
func (h *Handler) lookupFailed(r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away; not PostgreSQL's fault
	}
	if c := h.floodLog.Check(zapcore.ErrorLevel, "key lookup failed; answering 503"); c != nil {
		c.Write(zap.Error(err))
	}
}
