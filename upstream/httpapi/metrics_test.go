package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/promtest"
	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/schema/schematest"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

func TestMetricsCountRequestsByRouteAndGateRejectionsByGate(t *testing.T) {
	var m *httpapi.Metrics
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) {
		m = httpapi.NewMetrics(c.Pool)
		c.Metrics = m
	})
	admin := httptest.NewServer(httpapi.AdminHandler(e.Pool, m))
	t.Cleanup(admin.Close)

	e.Plan(small)
	full, roomy := e.Org("small"), e.Org("small")
	v1 := e.Gateway(full, store.RoleEditor)
	for range 2 {
		upstreamtest.WantStatus(t, v1.Do("POST", "/v1/monitors", `{"name":"m","type":"http","target":"https://example.com"}`), http.StatusCreated)
	}
	upstreamtest.Want(t, v1.Do("POST", "/v1/monitors", `{"name":"m","type":"http","target":"https://example.com"}`), http.StatusPaymentRequired, bodyMonitorQuota)
	upstreamtest.Want(t, e.Gateway(roomy, store.RoleEditor).Do("POST", "/v1/monitors", `{"name":"m","type":"http","target":"https://example.com","locations":["ap-southeast"]}`),
		http.StatusForbidden, bodyLocationGated("ap-southeast"))
	upstreamtest.WantStatus(t, v1.Do("GET", "/v1/monitors", ""), http.StatusOK)
	upstreamtest.WantStatus(t, e.Anon().Do("GET", "/no/such/route", ""), http.StatusNotFound)
	upstreamtest.WantStatus(t, e.Anon().With(httpapi.HeaderSecret, "wrong").Do("GET", "/v1/monitors", ""), http.StatusUnauthorized)

	got := promtest.Scrape(t, admin.URL+"/metrics")
	for series, w := range map[string]float64{
		`keygate_upstream_http_requests_total{code="201",route="POST /v1/monitors"}`:      2,
		`keygate_upstream_http_requests_total{code="402",route="POST /v1/monitors"}`:      1,
		`keygate_upstream_http_requests_total{code="403",route="POST /v1/monitors"}`:      1,
		`keygate_upstream_http_requests_total{code="200",route="GET /v1/monitors"}`:       1,
		`keygate_upstream_http_requests_total{code="404",route="none"}`:                   1,
		`keygate_upstream_http_requests_total{code="401",route="none"}`:                   1,
		`keygate_upstream_http_request_duration_seconds_count{route="POST /v1/monitors"}`: 4,
		`keygate_upstream_gate_rejections_total{gate="monitors"}`:                         1,
		`keygate_upstream_gate_rejections_total{gate="location"}`:                         1,
		`keygate_upstream_db_pool_max_conns`:                                              float64(e.Pool.Stat().MaxConns()),
	} {
		if g, ok := got[series]; !ok || g != w {
			t.Errorf("%s = %v (present: %v), want %v", series, g, ok, w)
		}
	}
	for _, series := range []string{"keygate_upstream_db_pool_acquires_total", "keygate_upstream_db_pool_total_conns", "go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := got[series]; !ok {
			t.Errorf("%s is not exported", series)
		}
	}
	for series := range got {
		if strings.Contains(series, full) || strings.Contains(series, "ap-southeast") {
			t.Errorf("an id or the client's input as a label: %s", series)
		}
	}
}

func TestHealthzAndReadyz(t *testing.T) {
	emptyPool, err := pgxpool.New(context.Background(), upstreamtest.EmptyDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(emptyPool.Close)
	migrated, _ := schematest.NewPool(t)
	for _, tc := range []struct {
		name      string
		pool      *pgxpool.Pool
		status    int
		readyBody string
	}{
		{"database up", migrated, http.StatusOK, `{"status":"ready"}`},
		{"database stopped", schematest.UnreachablePool(t), http.StatusServiceUnavailable, `{"error":"not_ready","reason":"database unreachable"}`},
		{"schema not applied", emptyPool, http.StatusServiceUnavailable, fmt.Sprintf(`{"error":"not_ready","reason":"database schema at version 0, needs %d"}`, store.RequiredSchemaVersion)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := httptest.NewServer(httpapi.AdminHandler(tc.pool, httpapi.NewMetrics(tc.pool)))
			defer admin.Close()
			res, err := http.Get(admin.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode != tc.status || strings.TrimSpace(string(b)) != tc.readyBody || res.Header.Get("Content-Type") != "application/json" {
				t.Errorf("/readyz = %d %q %s, want %d %s", res.StatusCode, res.Header.Get("Content-Type"), b, tc.status, tc.readyBody)
			}
			if status, body := upstreamtest.Get(t, admin.URL+"/healthz"); status != http.StatusOK || strings.TrimSpace(body) != `{"status":"ok","version":"`+version.String()+`"}` {
				t.Errorf("/healthz = %d %s, want 200 while serving", status, body)
			}
			if status, _ := upstreamtest.Get(t, admin.URL+"/metrics"); status != http.StatusOK {
				t.Errorf("/metrics = %d", status)
			}
		})
	}
}
