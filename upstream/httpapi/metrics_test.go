package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	dto "github.com/prometheus/client_model/go"

	"github.com/keygate/keygate/deploy/grafana"
	"github.com/keygate/keygate/internal/promtext"
	"github.com/keygate/keygate/schema/schematest"
)

// scrapeText parses Prometheus's text format into samples by series, e.g.
// `keygate_upstream_gate_rejections_total{gate="location"}`.
func scrapeText(t *testing.T, body string) map[string]float64 {
	t.Helper()
	out, err := promtext.Samples(body)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// get sends a GET to url and returns the status and body.
func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestMetricsCountRequestsByRouteAndGateRejectionsByGate(t *testing.T) {
	var m *Metrics
	e := newTestEnv(t, func(c *Config) {
		m = NewMetrics(c.Pool)
		c.Metrics = m
	})
	admin := httptest.NewServer(AdminHandler(e.pool, m))
	t.Cleanup(admin.Close)

	e.plan(small)
	full, roomy := e.org("small"), e.org("small")
	v1 := e.gateway(full, roleEditor)
	for range 2 {
		wantStatus(t, v1.do("POST", "/v1/monitors", `{"name":"m","type":"http","target":"https://example.com"}`), http.StatusCreated)
	}
	want(t, v1.do("POST", "/v1/monitors", `{"name":"m","type":"http","target":"https://example.com"}`), http.StatusPaymentRequired, bodyMonitorQuota)
	want(t, e.gateway(roomy, roleEditor).do("POST", "/v1/monitors", `{"name":"m","type":"http","target":"https://example.com","locations":["ap-southeast"]}`),
		http.StatusForbidden, bodyLocationGated("ap-southeast"))
	wantStatus(t, v1.do("GET", "/v1/monitors", ""), http.StatusOK)
	wantStatus(t, e.anon().do("GET", "/no/such/route", ""), http.StatusNotFound)
	wantStatus(t, e.anon().with(headerSecret, "wrong").do("GET", "/v1/monitors", ""), http.StatusUnauthorized)

	status, body := get(t, admin.URL+"/metrics")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", status, body)
	}
	got := scrapeText(t, body)
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
		`keygate_upstream_db_pool_max_conns`:                                              float64(e.pool.Stat().MaxConns()),
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
	emptyPool, err := pgxpool.New(context.Background(), emptyDatabase(t))
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
		{"schema not applied", emptyPool, http.StatusServiceUnavailable, fmt.Sprintf(`{"error":"not_ready","reason":"database schema at version 0, needs %d"}`, requiredSchemaVersion)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			admin := httptest.NewServer(AdminHandler(tc.pool, NewMetrics(tc.pool)))
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
			if status, body := get(t, admin.URL+"/healthz"); status != http.StatusOK || strings.TrimSpace(body) != `{"status":"ok"}` {
				t.Errorf("/healthz = %d %s, want 200 while serving", status, body)
			}
			if status, _ := get(t, admin.URL+"/metrics"); status != http.StatusOK {
				t.Errorf("/metrics = %d", status)
			}
		})
	}
}

// TestServeAdminAddrIsApartFromAddr runs `serve --admin-addr`: the admin endpoints
// answer there, and the public address knows none of them.
func TestServeAdminAddrIsApartFromAddr(t *testing.T) {
	dbURL := schematest.NewDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL, "GATEWAY_SECRET": testSecret}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := Main(ctx, []string{"serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"}, strings.NewReader(""), io.Discard, pw,
			func(k string) string { return env[k] })
		pw.Close()
		done <- code
	}()
	var addr, adminAddr string
	lines := bufio.NewScanner(pr)
	for addr == "" && lines.Scan() {
		var entry struct {
			Msg       string `json:"msg"`
			Addr      string `json:"addr"`
			AdminAddr string `json:"admin_addr"`
		}
		if err := json.Unmarshal(lines.Bytes(), &entry); err != nil {
			t.Fatalf("log line %q is not JSON", lines.Text())
		}
		switch entry.Msg {
		case "serving admin endpoints":
			adminAddr = entry.AdminAddr
		case "serving":
			addr = entry.Addr
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // logging never blocks the server
	if addr == "" || adminAddr == "" {
		t.Fatalf("serve logged addr %q and admin_addr %q", addr, adminAddr)
	}

	wantStatusOf := func(url string, status int, contains string) {
		t.Helper()
		got, body := get(t, url)
		if got != status || !strings.Contains(body, contains) {
			t.Errorf("GET %s = %d %.200s, want %d with %q", url, got, body, status, contains)
		}
	}
	wantStatusOf("http://"+addr+"/auth/nope", http.StatusNotFound, `"error"`)
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		wantStatusOf("http://"+addr+path, http.StatusNotFound, `{"error":"not found"}`)
	}
	wantStatusOf("http://"+adminAddr+"/healthz", http.StatusOK, `{"status":"ok"}`)
	wantStatusOf("http://"+adminAddr+"/readyz", http.StatusOK, `{"status":"ready"}`)
	wantStatusOf("http://"+adminAddr+"/metrics", http.StatusOK, `keygate_upstream_http_requests_total{code="404",route="none"} 4`)

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d", code)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("serve did not stop")
	}
}

// TestGrafanaDashboardQueriesOnlyExportedUpstreamSeries: every series of
// deploy/grafana/keygate.json that is not the gateway's (keygate_ without upstream_,
// checked in caddymodule) is one the upstream's /metrics exports.
func TestGrafanaDashboardQueriesOnlyExportedUpstreamSeries(t *testing.T) {
	m := NewMetrics(schematest.UnreachablePool(t))
	m.observe("GET /v1/monitors", http.StatusOK, time.Millisecond) // the vectors' series exist once they have a child
	m.gateRejected("monitors")
	families, err := m.registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	exported := map[string]bool{}
	for _, f := range families {
		exported[f.GetName()] = true
		if f.GetType() == dto.MetricType_HISTOGRAM || f.GetType() == dto.MetricType_SUMMARY {
			exported[f.GetName()+"_sum"], exported[f.GetName()+"_count"] = true, true
			if f.GetType() == dto.MetricType_HISTOGRAM {
				exported[f.GetName()+"_bucket"] = true
				delete(exported, f.GetName())
			}
		}
	}
	queried, err := grafana.Series()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range queried {
		if strings.HasPrefix(name, "keygate_") && !strings.HasPrefix(name, "keygate_upstream_") {
			continue
		}
		if !exported[name] {
			t.Errorf("the dashboard queries %s, which the upstream does not export", name)
		}
	}
	for _, name := range []string{"keygate_upstream_http_requests_total", "keygate_upstream_http_request_duration_seconds_bucket", "keygate_upstream_gate_rejections_total"} {
		if !slices.Contains(queried, name) {
			t.Errorf("the dashboard has no panel over %s", name)
		}
	}
}
