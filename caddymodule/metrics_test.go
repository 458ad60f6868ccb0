package caddymodule

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/deploy/grafana"
	alertrules "github.com/keygate/keygate/deploy/prometheus"
	"github.com/keygate/keygate/internal/testkit/latencyproxy"
	"github.com/keygate/keygate/internal/testkit/promtest"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// scrape reads Caddy's metrics handler and returns every sample by its series as the
// text format prints it, e.g. `keygate_requests_total{outcome="me"}`.
func (g *gateway) scrape(t testing.TB) map[string]float64 {
	t.Helper()
	return promtest.Scrape(t, g.base+"/metrics")
}

// wantSeries checks the difference of every named series between two scrapes. A
// series named with "=" is checked for its value in after instead.
func wantSeries(t *testing.T, before, after map[string]float64, want map[string]float64) {
	t.Helper()
	for name, w := range want {
		if abs, ok := strings.CutPrefix(name, "="); ok {
			if got, present := after[abs]; !present || got != w {
				t.Errorf("%s = %v (present: %v), want %v", abs, got, present, w)
			}
			continue
		}
		if _, ok := after[name]; !ok {
			t.Errorf("%s is not exported", name)
			continue
		}
		if got := after[name] - before[name]; got != w {
			t.Errorf("%s went up by %v, want %v", name, got, w)
		}
	}
}

// outcomeStep is one request of outcomeTraffic and what the gateway must decide.
type outcomeStep struct {
	tag     string // the query string, which tells the access log lines apart
	status  int
	outcome string
	keyID   string // the key the access log must name; "" for none
	orgID   string
}

// outcomeTraffic is a gateway in front of PostgreSQL and Redis through fault proxies
// (limiter_failure closed), and one request of every outcome, in order:
// unauthenticated twice (no key, a wrong secret), feature_gated, me, forbidden,
// proxied twice, rate_limited (a plan of 3 a minute), limiter_unavailable (Redis
// hung), lookup_unavailable (PostgreSQL hung). It leaves PostgreSQL hung.
type outcomeTraffic struct {
	gw        *gateway
	d         *db
	pg, redis *latencyproxy.Proxy
	steps     []outcomeStep
	keys      []string // every full key used, for the no-secret checks
	proOrg    string
	proKey    string // a key with a large budget, for recovery
	tinyKeyID string
	tinyOrgID string
}

func newOutcomeTraffic(t *testing.T, gc gatewayConfig) *outcomeTraffic {
	t.Helper()
	o := &outcomeTraffic{d: newDB(t)}
	o.d.plan("tiny", 3)
	o.tinyOrgID, o.proOrg = o.d.org("tiny"), o.d.org("pro")
	o.pg = newLatencyProxy(t, hostOf(t, o.d.url))
	o.redis = newLatencyProxy(t, hostOf(t, redisURL(t)))
	up := newUpstream(t)
	gc.handler = gatewayOptions(withHost(t, o.d.url, o.pg.Addr()), mergeMaps(map[string]any{
		"redis_url":        withHost(t, redisURL(t), o.redis.Addr()),
		"limiter_failure":  "closed",
		"database_timeout": "500ms",
		"redis_timeout":    "200ms",
	}, gc.handler))
	gc.upstream = up.addr()
	o.gw = startGateway(t, gc)
	// Cleanups run last first. The proxies forward again before Caddy stops, so closing
	// the pools does not wait on hung connections.
	t.Cleanup(func() { o.pg.Resume(); o.redis.Resume() })
	return o
}

func mergeMaps(a, b map[string]any) map[string]any {
	for k, v := range b {
		a[k] = v
	}
	return a
}

// run sends the requests of every outcome and checks their statuses.
func (o *outcomeTraffic) run(t *testing.T) {
	t.Helper()
	d := o.d
	admin, adminID := d.key(o.tinyOrgID, keystore.RoleAdmin)
	viewer, viewerID := d.key(o.tinyOrgID, keystore.RoleViewer)
	editor, editorID := d.key(o.tinyOrgID, keystore.RoleEditor)
	freeOrg := d.org("free")
	gated, gatedID := d.key(freeOrg, keystore.RoleAdmin)
	o.proKey, _ = d.key(o.proOrg, keystore.RoleAdmin)
	wrong := admin[:strings.IndexByte(admin, '.')+1] + strings.Repeat("A", 43)
	o.keys = []string{admin, viewer, editor, gated, o.proKey, wrong}
	o.tinyKeyID = adminID

	awayFromWindowEdge(t, 20*time.Second)
	type req struct {
		method, path, auth string
		before             func()
		step               outcomeStep
	}
	tiny := o.tinyOrgID
	for _, r := range []req{
		{"GET", "/v1/me", "", nil, outcomeStep{"noauth", 401, "unauthenticated", "", ""}},
		{"GET", "/v1/me", wrong, nil, outcomeStep{"wrongsecret", 401, "unauthenticated", "", ""}},
		{"GET", "/v1/me", gated, nil, outcomeStep{"gated", 403, "feature_gated", gatedID, freeOrg}},
		{"GET", "/v1/me", admin, nil, outcomeStep{"me", 200, "me", adminID, tiny}},
		{"POST", "/v1/echo", viewer, nil, outcomeStep{"viewerwrite", 403, "forbidden", viewerID, tiny}},
		{"GET", "/v1/echo", admin, nil, outcomeStep{"proxied1", 200, "proxied", adminID, tiny}},
		{"GET", "/v1/echo", admin, nil, outcomeStep{"proxied2", 200, "proxied", adminID, tiny}},
		{"GET", "/v1/echo", admin, nil, outcomeStep{"overlimit", 429, "rate_limited", adminID, tiny}},
		{"GET", "/v1/me", editor, func() { o.redis.Hang() }, outcomeStep{"redisdown", 503, "limiter_unavailable", editorID, tiny}},
		{"GET", "/v1/me", admin, func() { o.redis.Resume(); o.pg.Hang() }, outcomeStep{"pgdown", 503, "lookup_unavailable", "", ""}},
	} {
		if r.before != nil {
			r.before()
		}
		auth := ""
		if r.auth != "" {
			auth = "Bearer " + r.auth
		}
		res, body := o.gw.do(t, r.method, r.path+"?"+r.step.tag, auth, nil, "{}")
		if res.StatusCode != r.step.status {
			t.Fatalf("%s: status %d, want %d (%s)", r.step.tag, res.StatusCode, r.step.status, body)
		}
		o.steps = append(o.steps, r.step)
	}
}

// recover lets PostgreSQL answer again and waits for a request to get through.
func (o *outcomeTraffic) recover(t *testing.T) {
	t.Helper()
	o.pg.Resume()
	testenv.Eventually(t, 5*time.Second, "a request through once PostgreSQL answers again", func() bool {
		res, _ := o.gw.get(t, "/v1/me?recovery", o.proKey)
		return res.StatusCode == http.StatusOK
	})
}

// TestMetricsCountEveryOutcome scrapes Caddy's metrics handler after one request of
// every outcome. Each counter goes up by exactly its number of requests. The
// histograms count every lookup, batch and count. dependency_up follows PostgreSQL
// and Redis down and back up.
func TestMetricsCountEveryOutcome(t *testing.T) {
	o := newOutcomeTraffic(t, gatewayConfig{metrics: true})
	before := o.gw.scrape(t)
	for oc := range keystore.NumOutcomes {
		name := oc.String()
		if v, ok := before[`keygate_requests_total{outcome="`+name+`"}`]; !ok || v != 0 {
			t.Errorf("outcome %s before any request: %v (present: %v), want 0", name, v, ok)
		}
	}
	// Before any request, each dependency is pinged once (conns.Watch): the gauge is
	// absent until the answer, never a false 0.
	for _, dep := range []string{"postgres", "redis"} {
		if v, ok := before[`keygate_dependency_up{dependency="`+dep+`"}`]; ok && v != 1 {
			t.Errorf("dependency_up of %s before any request: %v, want 1 or no series", dep, v)
		}
	}

	o.run(t)
	after := o.gw.scrape(t)
	// Lookups: every request with a well-formed key (all but the first). Counts:
	// every request of a key with a positive limit past the feature gate (6).
	const lookups, counts = 9, 6
	wantSeries(t, before, after, map[string]float64{
		`keygate_requests_total{outcome="unauthenticated"}`:     2,
		`keygate_requests_total{outcome="feature_gated"}`:       1,
		`keygate_requests_total{outcome="me"}`:                  1,
		`keygate_requests_total{outcome="forbidden"}`:           1,
		`keygate_requests_total{outcome="proxied"}`:             2,
		`keygate_requests_total{outcome="rate_limited"}`:        1,
		`keygate_requests_total{outcome="limiter_unavailable"}`: 1,
		`keygate_requests_total{outcome="lookup_unavailable"}`:  1,
		`keygate_key_lookup_duration_seconds_count`:             lookups,
		`keygate_key_lookup_batch_size_count`:                   lookups, // one at a time: a batch each
		`keygate_key_lookup_batch_size_sum`:                     lookups,
		`keygate_limiter_duration_seconds_count`:                counts,
		`keygate_limiter_errors_total`:                          1,
		`=keygate_dependency_up{dependency="postgres"}`:         0,
		`=keygate_dependency_up{dependency="redis"}`:            0, // its last count failed
	})
	// Every series of a request lands in the +Inf bucket too.
	if after[`keygate_key_lookup_duration_seconds_bucket{le="+Inf"}`] != lookups {
		t.Errorf("lookup +Inf bucket %v, want %d", after[`keygate_key_lookup_duration_seconds_bucket{le="+Inf"}`], lookups)
	}
	for series := range after {
		if strings.HasPrefix(series, "keygate_") && (strings.Contains(series, o.tinyKeyID) || strings.Contains(series, o.tinyOrgID)) {
			t.Errorf("a key or org id as a label: %s", series)
		}
	}

	// Both back: a request gets through, and both are up again.
	o.recover(t)
	up := o.gw.scrape(t)
	wantSeries(t, after, up, map[string]float64{
		`=keygate_dependency_up{dependency="postgres"}`: 1,
		`=keygate_dependency_up{dependency="redis"}`:    1,
	})

	// Redis down alone: a count fails under closed, dependency_up of redis is 0.
	o.redis.Hang()
	if res, body := o.gw.get(t, "/v1/me", o.proKey); res.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("with redis hung: %d %s", res.StatusCode, body)
	}
	down := o.gw.scrape(t)
	wantSeries(t, up, down, map[string]float64{
		`=keygate_dependency_up{dependency="postgres"}`: 1,
		`=keygate_dependency_up{dependency="redis"}`:    0,
	})
	o.redis.Resume()
	o.recover(t)
	wantSeries(t, down, o.gw.scrape(t), map[string]float64{
		`=keygate_dependency_up{dependency="postgres"}`: 1,
		`=keygate_dependency_up{dependency="redis"}`:    1,
	})
}

// TestDependencyUpFollowsTheBreakers: a dependency whose breaker opened is 0. The
// requests the breaker refuses are no attempts, and leave it so. The probe that
// closes the breaker again sets it to 1, before any request has got through.
func TestDependencyUpFollowsTheBreakers(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	pg := newLatencyProxy(t, hostOf(t, d.url))
	rd := newLatencyProxy(t, hostOf(t, redisURL(t)))
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{metrics: true, upstream: up.addr(), handler: gatewayOptions(withHost(t, d.url, pg.Addr()), map[string]any{
		"redis_url":        withHost(t, redisURL(t), rd.Addr()),
		"limiter_failure":  "closed",
		"database_timeout": "300ms",
		"redis_timeout":    "200ms",
	})})
	t.Cleanup(func() { pg.Resume(); rd.Resume() })
	for _, dep := range []struct {
		name  string
		proxy *latencyproxy.Proxy
	}{{"postgres", pg}, {"redis", rd}} {
		series := `keygate_dependency_up{dependency="` + dep.name + `"}`
		dep.proxy.Hang()
		for range conns.BreakerThreshold {
			if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("%s hung: %d %s", dep.name, res.StatusCode, body)
			}
		}
		if got := gw.scrape(t)[series]; got != 0 {
			t.Fatalf("%s with its breaker open: %v, want 0", series, got)
		}
		dep.proxy.Resume()
		// The first request after the cooldown starts the probe, and it and every one
		// before the probe closes the breaker are refused. The gauge is 1 before the
		// breaker lets a request through, so a request answered otherwise finds it 1.
		testenv.Eventually(t, 10*time.Second, series+" back to 1", func() bool {
			if gw.scrape(t)[series] == 1 {
				return true
			}
			res, body := gw.get(t, "/v1/me", key)
			if res.StatusCode != http.StatusServiceUnavailable && gw.scrape(t)[series] != 1 {
				t.Fatalf("%s back, a request before the probe closed the breaker: %d %s, want 503", dep.name, res.StatusCode, body)
			}
			return false
		})
		if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
			t.Fatalf("%s back, breaker closed: %d %s", dep.name, res.StatusCode, body)
		}
	}
}

// TestAccessLogCarriesTheDecision reads the access log line of every outcome. It has
// the outcome, and once the key is known, key_id and org_id, all top-level. No line
// holds a key or its secret.
func TestAccessLogCarriesTheDecision(t *testing.T) {
	o := newOutcomeTraffic(t, gatewayConfig{accessLog: true, filterSecret: true, handler: map[string]any{"disable_metrics": true}})
	o.run(t)
	// The access log is written after the response: wait for every step's line.
	var text string
	lines := map[string]map[string]any{} // by tag
	testenv.Eventually(t, 5*time.Second, "an access log line for every request", func() bool {
		text = o.gw.logText(t)
		for line := range strings.Lines(text) {
			var entry map[string]any
			if json.Unmarshal([]byte(line), &entry) != nil || entry["msg"] != "handled request" {
				continue
			}
			req, _ := entry["request"].(map[string]any)
			uri, _ := req["uri"].(string)
			if _, tag, ok := strings.Cut(uri, "?"); ok {
				lines[tag] = entry
			}
		}
		for _, s := range o.steps {
			if _, ok := lines[s.tag]; !ok {
				return false
			}
		}
		return true
	})
	for _, s := range o.steps {
		entry, ok := lines[s.tag]
		if !ok {
			t.Errorf("%s: no access log line", s.tag)
			continue
		}
		if entry["outcome"] != s.outcome || entry["status"] != float64(s.status) {
			t.Errorf("%s: outcome %v status %v, want %s %d", s.tag, entry["outcome"], entry["status"], s.outcome, s.status)
		}
		for field, want := range map[string]string{"key_id": s.keyID, "org_id": s.orgID} {
			got, present := entry[field]
			switch {
			case want == "" && present:
				t.Errorf("%s: %s %v on a request whose key is not known", s.tag, field, got)
			case want != "" && got != want:
				t.Errorf("%s: %s %v, want %s", s.tag, field, got, want)
			}
		}
	}
	for _, key := range o.keys {
		_, secret, _ := strings.Cut(key, ".")
		if strings.Contains(text, secret) {
			t.Errorf("the log shows the secret of %s…", key[:20])
		}
	}
}

// TestMetricsSurviveAReload: a new config registers the same collectors in Caddy's
// new registry without an error. The counters go on from where they were.
func TestMetricsSurviveAReload(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	up := newUpstream(t)
	gc := gatewayConfig{handler: gatewayOptions(d.url, nil), upstream: up.addr(), metrics: true}
	gw := startGateway(t, gc)
	for range 3 {
		if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", res.StatusCode, body)
		}
	}
	const me = `keygate_requests_total{outcome="me"}`
	before := gw.scrape(t)
	if before[me] != 3 {
		t.Fatalf("%s = %v before the reload, want 3", me, before[me])
	}

	// Two handlers in the new config: both register, neither fails.
	gc.handler["strip_fields"] = []string{"config"}
	cfg := caddyConfig(strings.TrimPrefix(gw.base, "http://"), gw.logPath, gc)
	var parsed map[string]any
	if err := json.Unmarshal(cfg, &parsed); err != nil {
		t.Fatal(err)
	}
	routes := parsed["apps"].(map[string]any)["http"].(map[string]any)["servers"].(map[string]any)["gw"].(map[string]any)["routes"].([]any)
	v1 := routes[1].(map[string]any)
	v1["handle"] = append([]any{map[string]any{"handler": "v1_gateway", "database_url": d.url, "gateway_secret": testSecret}}, v1["handle"].([]any)...)
	cfg, _ = json.Marshal(parsed)
	gw.reload(t, cfg)

	after := gw.scrape(t)
	wantSeries(t, before, after, map[string]float64{
		"=" + me: 3,
		`=keygate_key_lookup_duration_seconds_count`: before[`keygate_key_lookup_duration_seconds_count`],
	})
	gw.get(t, "/v1/me", key) // answered by the first handler
	wantSeries(t, after, gw.scrape(t), map[string]float64{me: 1})
}

// TestDisableMetricsLeavesTheSeriesOut: disable_metrics registers nothing.
func TestDisableMetricsLeavesTheSeriesOut(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(d.url, map[string]any{"disable_metrics": true}),
		upstream: up.addr(), metrics: true,
	})
	gw.get(t, "/v1/me", key)
	for series := range gw.scrape(t) {
		if strings.HasPrefix(series, "keygate_") {
			t.Errorf("%s is exported with disable_metrics", series)
		}
	}
}

// exportedSeries returns the names of the series reg exports, with a histogram's
// _bucket, _sum and _count.
func exportedSeries(t *testing.T, reg *prometheus.Registry) map[string]bool {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, f := range families {
		switch f.GetType() {
		case dto.MetricType_HISTOGRAM:
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[f.GetName()+s] = true
			}
		case dto.MetricType_SUMMARY:
			names[f.GetName()], names[f.GetName()+"_sum"], names[f.GetName()+"_count"] = true, true, true
		default:
			names[f.GetName()] = true
		}
	}
	return names
}

// TestGrafanaDashboardQueriesOnlyExportedGatewaySeries: every keygate_ series of the
// gateway that deploy/grafana/keygate.json queries is one this package exports. The
// dashboard shows every one of them. (The upstream's are checked in upstream.)
func TestGrafanaDashboardQueriesOnlyExportedGatewaySeries(t *testing.T) {
	m := newMetrics()
	m.postgres.Set(1) // the vectors' series exist once they have a child
	reg := prometheus.NewPedanticRegistry()
	if err := m.register(reg); err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries(t, reg)
	queried, err := grafana.Series()
	if err != nil {
		t.Fatal(err)
	}
	shown := map[string]bool{}
	for _, name := range queried {
		if !strings.HasPrefix(name, "keygate_") || strings.HasPrefix(name, "keygate_upstream_") {
			continue
		}
		if !exported[name] {
			t.Errorf("the dashboard queries %s, which the gateway does not export", name)
		}
		shown[strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(name, "_bucket"), "_sum"), "_count")] = true
	}
	for _, c := range []string{metricRequests, metricLookupDuration, metricLookupBatchSize, metricLimiterDuration, metricLimiterErrors, metricDependencyUp,
		metricUsageDropped, metricUsageErrors, metricLookups, metricFenceWait, metricReplayWait} {
		if !shown[c] {
			t.Errorf("the dashboard has no panel over %s", c)
		}
	}
}

// TestAlertRulesReadOnlyExportedGatewaySeries: every keygate_ series of the gateway
// that deploy/prometheus/keygate.rules.yml reads is one this package exports. (The
// upstream's are checked in upstream.)
func TestAlertRulesReadOnlyExportedGatewaySeries(t *testing.T) {
	m := newMetrics()
	m.postgres.Set(1) // the vectors' series exist once they have a child
	m.standbyIn("standby", true)
	reg := prometheus.NewPedanticRegistry()
	if err := m.register(reg); err != nil {
		t.Fatal(err)
	}
	exported := exportedSeries(t, reg)
	read, err := alertrules.Series()
	if err != nil {
		t.Fatal(err)
	}
	gateway := 0
	for _, name := range read {
		if !strings.HasPrefix(name, "keygate_") || strings.HasPrefix(name, "keygate_upstream_") {
			continue
		}
		gateway++
		if !exported[name] {
			t.Errorf("the alert rules read %s, which the gateway does not export", name)
		}
	}
	if gateway == 0 {
		t.Errorf("the alert rules read no series of the gateway: %q", read)
	}
}

// BenchmarkMetricsBookkeeping is what metrics add to one proxied request: the lookup
// and count timings, their histograms, the gauges and the outcome counter. Compare
// with the CPU time of a request through the gateway (make bench, (m)).
func BenchmarkMetricsBookkeeping(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(map[bool]string{false: "disable_metrics", true: "metrics"}[on], func(b *testing.B) {
			h := &Handler{}
			if on {
				h.metrics = newMetrics()
			}
			lookups := newLookups(nil, nil, h.metrics)
			counts := redisCounts(nil, nil, nil, h.metrics)
			r := httptest.NewRequest(http.MethodGet, "/v1/monitors", nil)
			key := keystore.Key{ID: "AAAAAAAAAAAAAAAAAAAAAA", OrgID: "o"}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					lookups.dep.observe(lookups.dep.start(), nil)
					counts.dep.observe(counts.dep.start(), nil)
					h.record(r, keystore.OutcomeProxied, &key)
				}
			})
		})
	}
}

// TestTheLogFieldsAreSetOnlyWhenTheServerWritesAnAccessLog holds accessLogged. A
// server without an access log gets no extra log fields; one with a log gets them.
func TestTheLogFieldsAreSetOnlyWhenTheServerWritesAnAccessLog(t *testing.T) {
	key := keystore.Key{ID: "k", OrgID: "o"}
	for _, logged := range []bool{false, true} {
		srv := &caddyhttp.Server{}
		if logged {
			srv.Logs = &caddyhttp.ServerLogConfig{}
		}
		extra := new(caddyhttp.ExtraLogFields)
		ctx := context.WithValue(context.Background(), caddyhttp.ServerCtxKey, srv)
		ctx = context.WithValue(ctx, caddyhttp.ExtraLogFieldsCtxKey, extra)
		r := httptest.NewRequest(http.MethodGet, "/v1/me", nil).WithContext(ctx)
		(&Handler{}).record(r, keystore.OutcomeMe, &key)
		// The fields are Caddy's, unexported: their number is read by reflection.
		if n := reflect.ValueOf(extra).Elem().FieldByName("fields").Len(); n != map[bool]int{false: 0, true: 1}[logged] {
			t.Errorf("server with an access log %v: %d extra log fields set", logged, n)
		}
	}
}
