package caddymodule

import (
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/caddymodule/spans"
	"github.com/keygate/keygate/keystore"
)

// The names of the series. docs/operations.md lists them, and the Grafana dashboard
// (deploy/grafana) queries them.
const (
	metricRequests        = "keygate_requests_total"
	metricLookupDuration  = "keygate_key_lookup_duration_seconds"
	metricLookupBatchSize = "keygate_key_lookup_batch_size"
	metricLookups         = "keygate_key_lookups_total"
	metricFenceWait       = "keygate_key_lookup_fence_wait_seconds"
	metricReplayWait      = "keygate_key_lookup_replay_wait_seconds"
	metricLimiterDuration = "keygate_limiter_duration_seconds"
	metricLimiterErrors   = "keygate_limiter_errors_total"
	metricDependencyUp    = "keygate_dependency_up"
	metricStandbyUp       = "keygate_standby_up"
	metricLastUsedDropped = "keygate_last_used_dropped_total"
	metricLastUsedErrors  = "keygate_last_used_flush_errors_total"
	metricUsageDropped    = "keygate_usage_dropped_total"
	metricUsageErrors     = "keygate_usage_flush_errors_total"
)

// latencyBuckets suit a lookup or a count that takes about a millisecond. Either is
// cut off at its timeout: database_timeout (2s) or redis_timeout (200ms).
var latencyBuckets = []float64{.00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5}

// metrics are the gateway's Prometheus collectors. One set lives in pools, shared by
// every handler and carried across config reloads. Caddy makes a new registry for
// every config it loads, and each new config registers the same collectors in it.
// So the counters go on from where they were instead of starting again at zero.
//
// No label holds a key id, an org id or a path: their number is unbounded.
type metrics struct {
	requests        *prometheus.CounterVec
	lookupDuration  prometheus.Histogram
	batchSize       prometheus.Histogram
	lookups         *prometheus.CounterVec // with database_read_urls
	fenceWait       prometheus.Histogram   // with database_read_urls
	replayWait      prometheus.Histogram   // with database_read_urls
	limiterDuration prometheus.Histogram
	limiterErrors   prometheus.Counter
	dependencyUp    *prometheus.GaugeVec
	standbyUp       *prometheus.GaugeVec // with database_read_urls

	lastUsedDropped     prometheus.Counter
	lastUsedFlushErrors prometheus.Counter
	usageDropped        prometheus.Counter
	usageFlushErrors    prometheus.Counter

	// The children of the vectors, resolved once: the hot path does not hash labels.
	byOutcome [keystore.NumOutcomes]prometheus.Counter
	byServer  [2]prometheus.Counter // primary, standby
	postgres  depGauge
	redis     depGauge
}

// depGauge is one dependency's keygate_dependency_up, created by its first Set. A
// gateway that has not tried PostgreSQL yet shows no series, rather than a false 0.
// Nor does one that counts in process show one for Redis.
type depGauge struct {
	vec  *prometheus.GaugeVec
	name string
	once sync.Once
	g    prometheus.Gauge
}

func (d *depGauge) Set(v float64) {
	d.once.Do(func() { d.g = d.vec.WithLabelValues(d.name) })
	d.g.Set(v)
}

// setUp is the OnUp of the dependency's breaker (conns.Breaker.Up): 1 while the
// dependency answers, 0 once it failed.
func (d *depGauge) setUp(up bool) {
	v := 0.0
	if up {
		v = 1
	}
	d.Set(v)
}

// dependency returns the gauge of the dependency named name ("postgres" or "redis").
func (m *metrics) dependency(name string) *depGauge {
	if name == "redis" {
		return &m.redis
	}
	return &m.postgres
}

func newMetrics() *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricRequests,
			Help: "Requests the v1_gateway handler decided, by outcome."}, []string{"outcome"}),
		lookupDuration: newHistogram(metricLookupDuration,
			"Time a request waited for its key lookup in PostgreSQL, batching included.", latencyBuckets),
		batchSize: newHistogram(metricLookupBatchSize,
			"Distinct key ids per batched key lookup query.", prometheus.ExponentialBuckets(1, 2, 10)), // 1 … 512
		lookups: prometheus.NewCounterVec(prometheus.CounterOpts{Name: metricLookups,
			Help: "Key lookups answered with database_read_urls, by server: primary or standby."}, []string{"server"}),
		fenceWait: newHistogram(metricFenceWait,
			"Time a key lookup on a standby waited for its reading of the primary's WAL position after the standby answered.", latencyBuckets),
		replayWait: newHistogram(metricReplayWait,
			"Time a key lookup behind its reading of the primary's WAL position waited for a standby to replay it.", latencyBuckets),
		limiterDuration: newHistogram(metricLimiterDuration,
			"Time a request waited for its rate-limit count, pipelining included.", latencyBuckets),
		limiterErrors: newCounter(metricLimiterErrors,
			"Rate-limit counts that could not be made (Redis unreachable or slower than redis_timeout)."),
		dependencyUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricDependencyUp,
			Help: "1 while the last attempt to use the dependency succeeded (a request's, or the probe that closed its circuit breaker), else 0."}, []string{"dependency"}),
		standbyUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: metricStandbyUp,
			Help: "With database_read_urls: 1 while the standby takes key lookups, 0 while it is left out."}, []string{"standby"}),
		lastUsedDropped: newCounter(metricLastUsedDropped,
			"Uses of keys not noted for last_used_at because last_used_interval's cap of noted keys was reached."),
		lastUsedFlushErrors: newCounter(metricLastUsedErrors,
			"Writes of last_used_at that failed or timed out; their keys are written by the next one."),
		usageDropped: newCounter(metricUsageDropped,
			"Requests left out of the usage record because usage_buffer rows were held (PostgreSQL not taking the writes)."),
		usageFlushErrors: newCounter(metricUsageErrors,
			"Writes of the usage record that failed or timed out; their counts are held for the next one, up to usage_buffer rows."),
	}
	// Every outcome is there from the start, at 0, so that rate() and alerts see
	// the first request of each.
	for o := range keystore.NumOutcomes {
		m.byOutcome[o] = m.requests.WithLabelValues(o.String())
	}
	m.byServer = [2]prometheus.Counter{m.lookups.WithLabelValues("primary"), m.lookups.WithLabelValues("standby")}
	m.postgres = depGauge{vec: m.dependencyUp, name: "postgres"}
	m.redis = depGauge{vec: m.dependencyUp, name: "redis"}
	return m
}

// newCounter and newHistogram make the collectors that have no labels. Their
// options are a name, a help text and, for a histogram, its buckets.
func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newHistogram(name, help string, buckets []float64) prometheus.Histogram {
	return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets})
}

func (m *metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.requests, m.lookupDuration, m.batchSize, m.lookups, m.fenceWait, m.replayWait, m.limiterDuration, m.limiterErrors, m.dependencyUp, m.standbyUp,
		m.lastUsedDropped, m.lastUsedFlushErrors, m.usageDropped, m.usageFlushErrors}
}

// register adds m's collectors to reg. A collector already there is fine: another
// handler of the same config registered it. A different collector under one of our
// names is an error.
func (m *metrics) register(reg *prometheus.Registry) error {
	for _, c := range m.collectors() {
		err := reg.Register(c)
		if are, ok := errors.AsType[prometheus.AlreadyRegisteredError](err); ok && are.ExistingCollector == c {
			continue
		}
		if err != nil {
			return fmt.Errorf("registering metrics: %v", err)
		}
	}
	return nil
}

// metricsEntry is the shared metrics in pools.
type metricsEntry struct{ m *metrics }

func (metricsEntry) Destruct() error { return nil }

const metricsKey = "metrics"

// loadMetrics returns the shared metrics, registered in ctx's registry, and the key to
// give back to pools.
func loadMetrics(ctx caddy.Context) (*metrics, string, error) {
	v, _, _ := pools.LoadOrNew(metricsKey, func() (caddy.Destructor, error) {
		return metricsEntry{newMetrics()}, nil
	})
	m := v.(metricsEntry).m
	if reg := ctx.GetMetricsRegistry(); reg != nil {
		if err := m.register(reg); err != nil {
			_, _ = pools.Delete(metricsKey)
			return nil, "", err
		}
	}
	return m, metricsKey, nil
}

// record is what ServeHTTP calls once per request. It tolerates h.metrics == nil
// (disable_metrics). dependencies.go times the lookups and the counts.

// record notes the decision of a request of cost 1, one decided before its route is
// weighed (step 4): see recordUnits.
func (h *Handler) record(r *http.Request, o keystore.Outcome, key *keystore.Key) {
	h.recordUnits(r, o, key, 1)
}

// recordUnits notes the decision of a request weighing units: its counter and the
// usage record of its key (count), and the request's own records, its span and its
// access log fields (logOutcome). key is nil while the key is not known.
func (h *Handler) recordUnits(r *http.Request, o keystore.Outcome, key *keystore.Key, units int) {
	h.count(o, key, units)
	h.logOutcome(r, o, key, units)
}

// count counts the decision o of a request weighing units in its counter, and in the
// usage record of its key (countDecided), if known.
func (h *Handler) count(o keystore.Outcome, key *keystore.Key, units int) {
	if h.metrics != nil {
		h.metrics.byOutcome[o].Inc()
	}
	if key != nil {
		h.countDecided(key, o, units)
	}
}

// logOutcome notes the decision o of r in r's own records: its span where it is traced
// (spans.Decided), and the access log's outcome, key_id and org_id fields, if its
// server writes an access log.
func (h *Handler) logOutcome(r *http.Request, o keystore.Outcome, key *keystore.Key, units int) {
	spans.Decided(r, o, key, units)
	extra, ok := r.Context().Value(caddyhttp.ExtraLogFieldsCtxKey).(*caddyhttp.ExtraLogFields)
	if !ok || !accessLogged(r) {
		return
	}
	lf := &outcomeOnly[o]
	if key != nil {
		lf = &logFields{outcome: o, hasKey: true, keyID: key.ID, orgID: key.OrgID}
	}
	extra.Set(zap.Field{Key: logFieldsKey, Type: zapcore.InlineMarshalerType, Interface: lf})
}

// answer records the decision o of r, as record does, and writes the module's own
// answer to it: body with o's status. The client, the metrics, the access log and
// the usage record so take the outcome and its status from one place, the outcomes
// of keystore.Outcome.
func (h *Handler) answer(w http.ResponseWriter, r *http.Request, o keystore.Outcome, key *keystore.Key, body []byte) {
	h.answerUnits(w, r, o, key, 1, body)
}

// answerUnits is answer for a request weighing units, one decided once its route is
// weighed (step 4 on): the usage record counts its route's cost.
func (h *Handler) answerUnits(w http.ResponseWriter, r *http.Request, o keystore.Outcome, key *keystore.Key, units int, body []byte) {
	h.recordUnits(r, o, key, units)
	writeJSON(w, o.Status(), body)
}

// accessLogged tells whether r's server writes access logs (Caddy's Server.Logs,
// the log directive). Without them nothing reads the extra log fields. Setting them
// costs a request four allocations: the fields, the slice of them, and two for the
// clear of Caddy's handler cache. A request without a server in its context counts
// as logged.
func accessLogged(r *http.Request) bool {
	srv, ok := r.Context().Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	return !ok || srv.Logs != nil
}

// logFieldsKey names record's one extra log field, so that a second record of the
// same request replaces it. The name itself is never logged: the field is inline.
const logFieldsKey = "keygate"

// logFields are the access log fields of record: outcome, and key_id and org_id
// once the key is known. They go in as one inline field, written at the top level of
// the entry as three. That is one allocation. Three fields would grow the slice of
// extra fields three times, and clear Caddy's handler cache three times.
type logFields struct {
	outcome      keystore.Outcome
	hasKey       bool
	keyID, orgID string
}

// outcomeOnly are the logFields of the requests decided before their key is known.
// They are shared and never written to, so the flood of 401s allocates none.
var outcomeOnly = func() (lf [keystore.NumOutcomes]logFields) {
	for o := range keystore.NumOutcomes {
		lf[o].outcome = o
	}
	return lf
}()

func (f *logFields) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddString("outcome", f.outcome.String())
	if f.hasKey {
		enc.AddString("key_id", f.keyID)
		enc.AddString("org_id", f.orgID)
	}
	return nil
}

// observeBatch is the Batcher's OnBatch.
func (m *metrics) observeBatch(size int) { m.batchSize.Observe(float64(size)) }

// observeLookupServer counts a lookup by the server that answered it, for the
// Reader's OnLookup.
func (m *metrics) observeLookupServer(standby bool) {
	if standby {
		m.byServer[1].Inc()
	} else {
		m.byServer[0].Inc()
	}
}

// standbyIn sets keygate_standby_up of the standby at host: 1 in, 0 out. It does
// nothing with m nil (disable_metrics).
func (m *metrics) standbyIn(host string, in bool) {
	if m != nil {
		m.standbyUp.WithLabelValues(host).Set(map[bool]float64{true: 1}[in])
	}
}

// observeFenceWait is the Reader's OnFenceWait.
func (m *metrics) observeFenceWait(d time.Duration) { m.fenceWait.Observe(d.Seconds()) }

// observeReplayWait is the Reader's OnReplayWait.
func (m *metrics) observeReplayWait(d time.Duration) { m.replayWait.Observe(d.Seconds()) }
