package usageexport_test

import (
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/promtest"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/httpapi"
)

func TestTheMetricsCountEventsByResultAndShowTheOldestMinutesAge(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) int { return []int{503, 503, 202}[min(n, 2)] })
	m := httpapi.NewMetrics(e.Pool)
	x := e.exporter(config(rc), m)
	m.WatchUsageExport(x.Lag)
	admin := httptest.NewServer(m.Handler())
	t.Cleanup(admin.Close)
	const (
		delivered = `keygate_upstream_usage_export_events_total{result="delivered"}`
		retrying  = `keygate_upstream_usage_export_events_total{result="retrying"}`
		age       = `keygate_upstream_usage_export_oldest_age_seconds`
	)
	want := func(what string, series map[string]float64) {
		t.Helper()
		got := promtest.Scrape(t, admin.URL)
		for name, v := range series {
			if got[name] != v {
				t.Errorf("%s: %s = %v, want %v", what, name, got[name], v)
			}
		}
	}
	want("nothing yet", map[string]float64{delivered: 0, retrying: 0, age: 0})

	m0 := e.clock.Now().Truncate(time.Minute)
	m1 := m0.Add(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 1)
	e.record(keyB, m1, keystore.OutcomeProxied, 200, 1, 1)
	e.at(m0.Add(3*time.Minute + 30*time.Second)) // m0 settled 30 s ago, not cut yet; m1 not settled
	want("m0 settled, not cut", map[string]float64{age: 30})
	drain(t, x) // the receiver answers 503
	want("m0 cut, refused", map[string]float64{delivered: 0, retrying: 1, age: 30})
	e.clock.Advance(40 * time.Second) // m1 settled 10 s ago
	drain(t, x)                       // m0's event again, and m1's: 503
	want("both refused", map[string]float64{delivered: 0, retrying: 3, age: 70})
	e.clock.Advance(10 * time.Second)
	drain(t, x)
	want("both delivered", map[string]float64{delivered: 2, retrying: 3, age: 0})

	// Every series of the export that docs/operations.md names, its alerts' among
	// them, is one the upstream serves.
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	served := promtest.Scrape(t, admin.URL)
	names := regexp.MustCompile(`keygate_upstream_usage_export_[a-z_]+`).FindAllString(string(doc), -1)
	if len(names) < 4 {
		t.Fatalf("docs/operations.md names %d series of the export", len(names))
	}
	for _, name := range names {
		found := false
		for series := range served {
			found = found || series == name || strings.HasPrefix(series, name+"{")
		}
		if !found {
			t.Errorf("docs/operations.md names %s, which the upstream does not serve", name)
		}
	}
}
