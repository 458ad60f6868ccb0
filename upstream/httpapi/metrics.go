package httpapi

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routeNone is the route label of a request no route took: a 404, a 405, or a /v1
// request refused for its gateway secret before routing.
const routeNone = "none"

// Metrics are the upstream's Prometheus series, served by `serve --admin-addr` on
// /metrics (CONTRACT §10): requests by route (the mux pattern, never the path, so that
// ids stay out of the labels) and status, their durations by route, plan-gate
// rejections by gate, the database pool's statistics, and the Go runtime's and the
// process's collectors. A nil *Metrics records nothing.
type Metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	gates    *prometheus.CounterVec
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
	}
	m.registry.MustRegister(
		m.requests, m.duration, m.gates,
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

// observe records one answered request. status 0 is a 200 nothing was written for.
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

// gateRejected counts a refusal by the plan gate named in detail: the metric of a
// quota_exceeded or the feature of a feature_gated answer, without what follows a
// colon ("location:mars" is the gate "location"), so that the client's input never
// becomes a label.
func (m *Metrics) gateRejected(detail string) {
	if m == nil {
		return
	}
	gate, _, _ := strings.Cut(detail, ":")
	m.gates.WithLabelValues(gate).Inc()
}

// poolCollector exports pgxpool's statistics, read at every scrape.
type poolCollector struct{ pool *pgxpool.Pool }

var (
	poolAcquired = prometheus.NewDesc("keygate_upstream_db_pool_acquired_conns",
		"Connections of the database pool in use.", nil, nil)
	poolIdle = prometheus.NewDesc("keygate_upstream_db_pool_idle_conns",
		"Idle connections of the database pool.", nil, nil)
	poolTotal = prometheus.NewDesc("keygate_upstream_db_pool_total_conns",
		"Connections of the database pool, in use, idle or being opened.", nil, nil)
	poolMax = prometheus.NewDesc("keygate_upstream_db_pool_max_conns",
		"Largest number of connections the database pool opens.", nil, nil)
	poolAcquires = prometheus.NewDesc("keygate_upstream_db_pool_acquires_total",
		"Connections acquired from the database pool.", nil, nil)
	poolEmptyAcquires = prometheus.NewDesc("keygate_upstream_db_pool_empty_acquires_total",
		"Acquires that had to wait for a connection to be opened or released.", nil, nil)
	poolCanceledAcquires = prometheus.NewDesc("keygate_upstream_db_pool_canceled_acquires_total",
		"Acquires given up because their context ended.", nil, nil)
	poolAcquireSeconds = prometheus.NewDesc("keygate_upstream_db_pool_acquire_seconds_total",
		"Time spent acquiring connections from the database pool.", nil, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{poolAcquired, poolIdle, poolTotal, poolMax,
		poolAcquires, poolEmptyAcquires, poolCanceledAcquires, poolAcquireSeconds} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.pool.Stat()
	gauge := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v)
	}
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge(poolAcquired, float64(s.AcquiredConns()))
	gauge(poolIdle, float64(s.IdleConns()))
	gauge(poolTotal, float64(s.TotalConns()))
	gauge(poolMax, float64(s.MaxConns()))
	counter(poolAcquires, float64(s.AcquireCount()))
	counter(poolEmptyAcquires, float64(s.EmptyAcquireCount()))
	counter(poolCanceledAcquires, float64(s.CanceledAcquireCount()))
	counter(poolAcquireSeconds, s.AcquireDuration().Seconds())
}
