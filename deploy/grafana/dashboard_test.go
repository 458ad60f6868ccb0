package grafana_test

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/keygate/keygate/deploy/grafana"
)

func TestSeriesOf(t *testing.T) {
	for _, tc := range []struct {
		expr string
		want []string
	}{
		{`sum by (outcome) (rate(keygate_requests_total[$__rate_interval]))`, []string{"keygate_requests_total"}},
		{`histogram_quantile(0.99, sum by (route, le) (rate(a_bucket{route=~"GET .*"}[5m])))`, []string{"a_bucket"}},
		{`sum(rate(a_sum[1m])) / sum(rate(a_count[1m])) > 1e3 and on (job) up == 1`, []string{"a_sum", "a_count", "up"}},
		{`rate(http2_frames_total[5m]) * 2`, []string{"http2_frames_total"}},
		{`min by (dependency) (keygate_dependency_up)`, []string{"keygate_dependency_up"}},
		{`sum(process_resident_memory_bytes{job=~"$upstream_job"}) / 1e6`, []string{"process_resident_memory_bytes"}},
	} {
		if got := grafana.SeriesOf(tc.expr); !slices.Equal(got, tc.want) {
			t.Errorf("SeriesOf(%q) = %q, want %q", tc.expr, got, tc.want)
		}
	}
}

func TestDashboardHasQueries(t *testing.T) {
	names, err := grafana.Series()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"keygate_requests_total", "keygate_dependency_up", "keygate_upstream_http_requests_total"} {
		if !slices.Contains(names, want) {
			t.Errorf("the dashboard does not query %s; it queries %q", want, names)
		}
	}
}

// TestPanelsHaveOwnIDsAndPlaces: Grafana keys a panel by its id, and draws panels
// where gridPos says. Two panels with one id, or two on one place, show as one.
func TestPanelsHaveOwnIDsAndPlaces(t *testing.T) {
	var doc struct {
		Panels []struct {
			ID      int    `json:"id"`
			Title   string `json:"title"`
			GridPos struct {
				H, W, X, Y int
			} `json:"gridPos"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(grafana.Dashboard, &doc); err != nil {
		t.Fatal(err)
	}
	ids := map[int]string{}
	for i, p := range doc.Panels {
		if other, ok := ids[p.ID]; ok {
			t.Errorf("panels %q and %q share the id %d", other, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		a := p.GridPos
		if a.W <= 0 || a.H <= 0 || a.X < 0 || a.X+a.W > 24 {
			t.Errorf("panel %q: gridPos %+v is not within the 24 columns", p.Title, a)
		}
		for _, q := range doc.Panels[:i] {
			b := q.GridPos
			if a.X < b.X+b.W && b.X < a.X+a.W && a.Y < b.Y+b.H && b.Y < a.Y+a.H {
				t.Errorf("panels %q %+v and %q %+v overlap", q.Title, b, p.Title, a)
			}
		}
	}
}
