package httpapi

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/usageexport"
	"github.com/keygate/keygate/upstream/webhook"
)

// routeNone is the route label of a request no route took. It is a 404, a 405, or a
// /v1 request refused before routing for its gateway secret.
const routeNone = "none"

// Metrics are the upstream's Prometheus series, served on /metrics by `serve
// --admin-addr` (docs/operations.md). They count requests by route and status, and
// time them by route. The route is the mux pattern, never the path, so ids stay out of
// the labels. They count plan-gate refusals by gate. They export the database pool's
// statistics, the Go runtime's and the process's. A nil *Metrics records nothing.
type Metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	gates    *prometheus.CounterVec
	webhooks *prometheus.CounterVec
	exported *prometheus.CounterVec
}

// NewMetrics returns the upstream's metrics in a registry of their own, with the
// statistics of pool.
func NewMetrics(pool *pgxpool.Pool) *Metrics {
	m := &Metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keygate_upstream_http_requests_total",
			Help: "HTTP requests answered, by route (mux pattern) and status code.",
		}, []string{"route", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "keygate_upstream_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route (mux pattern).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"route"}),
		gates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keygate_upstream_gate_rejections_total",
			Help: "Requests refused by a plan gate: monitors, min_interval_seconds, location, check_type or api.",
		}, []string{"gate"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keygate_upstream_webhook_deliveries_total",
			Help: "Webhook delivery attempts, by result: delivered, retrying (failed, tried again later) or failed (the last attempt failed).",
		}, []string{"result"}),
		exported: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "keygate_upstream_usage_export_events_total",
			Help: "Usage events sent to the usage export's receiver, by result: delivered (a 2xx) or retrying (any other answer, or none; sent again later).",
		}, []string{"result"}),
	}
	for _, r := range []string{webhook.ResultDelivered, webhook.ResultRetrying, webhook.ResultFailed} {
		m.webhooks.WithLabelValues(r)
	}
	for _, r := range []string{usageexport.ResultDelivered, usageexport.ResultRetrying} {
		m.exported.WithLabelValues(r)
	}
	m.registry.MustRegister(
		m.requests, m.duration, m.gates, m.webhooks, m.exported, outboxCollector{store.New(pool)},
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		poolCollector{pool},
	)
	return m
}

// Handler serves the metrics in Prometheus's text (or OpenMetrics) format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}

// observe records one answered request. Status 0 is a 200 with nothing written.
func (m *Metrics) observe(route string, status int, took time.Duration) {
	if m == nil {
		return
	}
	if route == "" {
		route = routeNone
	}
	if status == 0 {
		status = http.StatusOK
	}
	m.requests.WithLabelValues(route, strconv.Itoa(status)).Inc()
	m.duration.WithLabelValues(route).Observe(took.Seconds())
}

// gateRejected counts a refusal by the plan gate named in detail. detail is the metric
// of a quota_exceeded or the feature of a feature_gated answer. What follows a colon
// is dropped, so the client's input never becomes a label: "location:mars" is the gate
// "location".
func (m *Metrics) gateRejected(detail string) {
	if m == nil {
		return
	}
	gate, _, _ := strings.Cut(detail, ":")
	m.gates.WithLabelValues(gate).Inc()
}

// WebhookAttempt counts a webhook attempt by result (webhook.Observer).
func (m *Metrics) WebhookAttempt(result string) {
	if m == nil {
		return
	}
	m.webhooks.WithLabelValues(result).Inc()
}

// UsageExportEvents counts n events of a usage export attempt by result
// (usageexport.Observer).
func (m *Metrics) UsageExportEvents(result string, n int) {
	if m == nil {
		return
	}
	m.exported.WithLabelValues(result).Add(float64(n))
}

// WatchUsageExport exports the age lag reports, read at every scrape: the usage
// export's oldest settled minute not yet taken by its receiver. serve calls it when
// it exports.
func (m *Metrics) WatchUsageExport(lag func(context.Context) (time.Duration, error)) {
	if m == nil {
		return
	}
	m.registry.MustRegister(exportCollector{lag})
}

// exportCollector exports the usage export's lag, read from the database at every
// scrape, so every exporting instance reports the one outbox alike.
type exportCollector struct {
	lag func(context.Context) (time.Duration, error)
}

var exportAge = prometheus.NewDesc("keygate_upstream_usage_export_oldest_age_seconds",
	"Time since the oldest settled minute whose usage the export's receiver has not all taken settled; 0 when there is none.", nil, nil)

func (c exportCollector) Describe(ch chan<- *prometheus.Desc) { ch <- exportAge }

func (c exportCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	age, err := c.lag(ctx)
	if err != nil {
		return // absent while the database is, as the webhook outbox's age
	}
	ch <- prometheus.MustNewConstMetric(exportAge, prometheus.GaugeValue, age.Seconds())
}

// outboxCollector exports the age of the oldest webhook delivery not yet made, read
// from the database at every scrape, so every instance reports the one outbox alike.
type outboxCollector struct{ store *store.Store }

var outboxAge = prometheus.NewDesc("keygate_upstream_webhook_outbox_oldest_age_seconds",
	"Age of the oldest pending webhook delivery of an enabled endpoint; 0 when there is none.", nil, nil)

func (c outboxCollector) Describe(ch chan<- *prometheus.Desc) { ch <- outboxAge }

func (c outboxCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	age, err := c.store.OldestUndelivered(ctx, time.Now())
	if err != nil {
		// The series is absent while the database is: the scrape must still show the
		// rest, the pool's statistics above all. /readyz says why.
		return
	}
	ch <- prometheus.MustNewConstMetric(outboxAge, prometheus.GaugeValue, age.Seconds())
}

// poolCollector exports pgxpool's statistics, read at every scrape.
type poolCollector struct{ pool *pgxpool.Pool }

// poolStat is one of pgxpool's statistics as a metric. It has a description, a kind
// (gauge or counter), and a way to read it from a Stat.
type poolStat struct {
	desc *prometheus.Desc
	kind prometheus.ValueType
	read func(*pgxpool.Stat) float64
}

// newPoolStat returns the poolStat of the metric name of kind. help explains it and
// read reads it.
func newPoolStat[N int32 | int64 | float64](kind prometheus.ValueType, name, help string, read func(*pgxpool.Stat) N) poolStat {
	return poolStat{
		desc: prometheus.NewDesc(name, help, nil, nil),
		kind: kind,
		read: func(s *pgxpool.Stat) float64 { return float64(read(s)) },
	}
}

// acquireSeconds is the time spent acquiring connections, in seconds.
func acquireSeconds(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }

// poolStats are the statistics poolCollector exports.
var poolStats = []poolStat{
	newPoolStat(prometheus.GaugeValue, "keygate_upstream_db_pool_acquired_conns", "Connections of the database pool in use.", (*pgxpool.Stat).AcquiredConns),
	newPoolStat(prometheus.GaugeValue, "keygate_upstream_db_pool_idle_conns", "Idle connections of the database pool.", (*pgxpool.Stat).IdleConns),
	newPoolStat(prometheus.GaugeValue, "keygate_upstream_db_pool_total_conns", "Connections of the database pool, in use, idle or being opened.", (*pgxpool.Stat).TotalConns),
	newPoolStat(prometheus.GaugeValue, "keygate_upstream_db_pool_max_conns", "Largest number of connections the database pool opens.", (*pgxpool.Stat).MaxConns),
	newPoolStat(prometheus.CounterValue, "keygate_upstream_db_pool_acquires_total", "Connections acquired from the database pool.", (*pgxpool.Stat).AcquireCount),
	newPoolStat(prometheus.CounterValue, "keygate_upstream_db_pool_empty_acquires_total", "Acquires that had to wait for a connection to be opened or released.", (*pgxpool.Stat).EmptyAcquireCount),
	newPoolStat(prometheus.CounterValue, "keygate_upstream_db_pool_canceled_acquires_total", "Acquires given up because their context ended.", (*pgxpool.Stat).CanceledAcquireCount),
	newPoolStat(prometheus.CounterValue, "keygate_upstream_db_pool_acquire_seconds_total", "Time spent acquiring connections from the database pool.", acquireSeconds),
}

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, st := range poolStats {
		ch <- st.desc
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	for _, st := range poolStats {
		ch <- prometheus.MustNewConstMetric(st.desc, st.kind, st.read(s))
	}
}
