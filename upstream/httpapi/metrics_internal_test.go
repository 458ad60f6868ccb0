package httpapi

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/keygate/keygate/deploy/grafana"
	alertrules "github.com/keygate/keygate/deploy/prometheus"
	"github.com/keygate/keygate/schema/schematest"
)

// exportedSeries returns the names of the series the upstream's /metrics exports,
// each histogram's as _bucket, _sum and _count, against a migrated database (the
// outbox's age is read from it at each scrape, and is absent while the database is).
func exportedSeries(t *testing.T) map[string]bool {
	t.Helper()
	pool, _ := schematest.NewPool(t)
	m := NewMetrics(pool)
	m.observe("GET /v1/monitors", http.StatusOK, time.Millisecond) // the vectors' series exist once they have a child
	m.gateRejected("monitors")
	// serve watches the usage export's age when it exports.
	m.WatchUsageExport(func(context.Context) (time.Duration, error) { return 0, nil })
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
	return exported
}

// TestAlertRulesReadOnlyExportedUpstreamSeries: every keygate_upstream_ series that
// deploy/prometheus/keygate.rules.yml reads is one the upstream's /metrics exports.
// (The gateway's are checked in caddymodule.)
func TestAlertRulesReadOnlyExportedUpstreamSeries(t *testing.T) {
	exported := exportedSeries(t)
	read, err := alertrules.Series()
	if err != nil {
		t.Fatal(err)
	}
	upstream := 0
	for _, name := range read {
		if !strings.HasPrefix(name, "keygate_upstream_") {
			continue
		}
		upstream++
		if !exported[name] {
			t.Errorf("the alert rules read %s, which the upstream does not export", name)
		}
	}
	if upstream == 0 {
		t.Errorf("the alert rules read no series of the upstream: %q", read)
	}
}

// TestGrafanaDashboardQueriesOnlyExportedUpstreamSeries checks the upstream's series of
// deploy/grafana/keygate.json: each is one its /metrics exports. The gateway's series,
// keygate_ without upstream_, are checked in caddymodule.
func TestGrafanaDashboardQueriesOnlyExportedUpstreamSeries(t *testing.T) {
	exported := exportedSeries(t)
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
