package caddymodule

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/keygate/keygate/caddymodule/routetable"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// countedRows is a usageRecorder double: one "org key outcome status" line a request,
// its units and the time it was counted at.
type countedRows struct {
	mu    sync.Mutex // a second look records from a goroutine of its own
	rows  []string
	units []int
	at    []time.Time
}

func (c *countedRows) Record(orgID, keyID string, at time.Time, outcome keystore.Outcome, status, units int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.rows = append(c.rows, fmt.Sprintf("%s %s %s %d", orgID, keyID, outcome, status))
	c.units = append(c.units, units)
	c.at = append(c.at, at)
}

// snapshot returns the rows counted so far.
func (c *countedRows) snapshot() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.rows)
}

// brokenBody is a request body the client breaks after a few bytes (malformed
// chunking, as net/http reports it).
type brokenBody struct{ sent bool }

func (b *brokenBody) Read(p []byte) (int, error) {
	if !b.sent {
		b.sent = true
		return copy(p, `{"name":`), nil
	}
	return 0, errors.New("malformed chunked encoding")
}

// TestUsageCountsEveryAnswerOfAnIdentifiedKey: a request whose key was identified is
// counted once, with its outcome and the status the client got, whoever answered it;
// a request with no identified key is not counted. Its units are its route's cost
// once the route is weighed (step 4), 1 for an answer decided before: under the
// built-in table, and under a table where every /v1 request costs 3.
func TestUsageCountsEveryAnswerOfAnIdentifiedKey(t *testing.T) {
	for _, table := range []struct {
		name   string
		routes []Route // nil: the built-in table
		cost   int
	}{
		{"built-in routes", nil, 1},
		{"every route costs 3", []Route{{Methods: []string{"*"}, Path: "/v1/*", Cost: 3}}, 3},
	} {
		t.Run(table.name, func(t *testing.T) { testUsageCountsEveryAnswer(t, table.routes, table.cost) })
	}
}

func testUsageCountsEveryAnswer(t *testing.T, routes []Route, cost int) {
	jsonStatus := func(status int) upstream {
		return func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			_, err := io.WriteString(w, `{"id":"m1"}`)
			return err
		}
	}
	for _, tc := range []struct {
		name           string
		method, path   string
		auth           string // "": no Authorization
		body           io.Reader
		used           int // requests of the key already counted in this window
		verifierErr    error
		limiterFailure string
		upstream       upstream
		want           string // the row counted; "": none
	}{
		{name: "me", path: "/v1/me", auth: bearer("AdminAdminAdminAdmin01"), want: "org-1 AdminAdminAdminAdmin01 me 200"},
		{name: "me, HEAD", method: http.MethodHead, path: "/v1/me", auth: bearer("ViewerViewerViewer0001"), want: "org-1 ViewerViewerViewer0001 me 200"},
		{name: "proxied 200", path: "/v1/monitors", auth: bearer("EditorEditorEditor0001"), want: "org-1 EditorEditorEditor0001 proxied 200"},
		{name: "proxied 201", method: http.MethodPost, path: "/v1/monitors", auth: bearer("EditorEditorEditor0001"),
			upstream: jsonStatus(http.StatusCreated), want: "org-1 EditorEditorEditor0001 proxied 201"},
		{name: "proxied 404 of the upstream", path: "/v1/monitors/m9", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: jsonStatus(http.StatusNotFound), want: "org-1 AdminAdminAdminAdmin01 proxied 404"},
		{name: "proxied 304 of the upstream", path: "/v1/monitors/m1", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: func(w http.ResponseWriter, _ *http.Request) error { w.WriteHeader(http.StatusNotModified); return nil },
			want:     "org-1 AdminAdminAdminAdmin01 proxied 304"},
		{name: "proxied, an upstream error that is not JSON", path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: func(w http.ResponseWriter, _ *http.Request) error {
				w.Header().Set("Content-Type", "text/html")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, err := io.WriteString(w, "<h1>down</h1>")
				return err
			}, want: "org-1 AdminAdminAdminAdmin01 proxied 503"},
		{name: "proxied, the upstream unreachable: the gateway's 502", path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: func(http.ResponseWriter, *http.Request) error {
				return caddyhttp.Error(http.StatusBadGateway, errors.New("dial tcp: connection refused"))
			}, want: "org-1 AdminAdminAdminAdmin01 proxied 502"},
		{name: "proxied, the upstream timed out: the gateway's 504", path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: func(http.ResponseWriter, *http.Request) error {
				return caddyhttp.Error(http.StatusGatewayTimeout, context.DeadlineExceeded)
			}, want: "org-1 AdminAdminAdminAdmin01 proxied 504"},
		{name: "proxied, an encoding the filter cannot read: the gateway's 502", path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: func(w http.ResponseWriter, _ *http.Request) error {
				w.Header().Set("Content-Type", "application/json")
				w.Header().Set("Content-Encoding", "br")
				_, err := io.WriteString(w, "\x1b\x2f")
				return err
			}, want: "org-1 AdminAdminAdminAdmin01 proxied 502"},
		{name: "proxied, a body the client broke: 400", method: http.MethodPost, path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			body: &brokenBody{},
			upstream: func(_ http.ResponseWriter, r *http.Request) error {
				_, err := io.ReadAll(r.Body)
				return caddyhttp.Error(statusClientClosed, err)
			}, want: "org-1 AdminAdminAdminAdmin01 proxied 400"},
		{name: "proxied, nothing written: the server's 200", path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			upstream: func(http.ResponseWriter, *http.Request) error { return nil },
			want:     "org-1 AdminAdminAdminAdmin01 proxied 200"},
		{name: "proxied, through under limiter_failure open", path: "/v1/monitors", auth: bearer("AdminAdminAdminAdmin01"),
			limiterFailure: "open", want: "org-1 AdminAdminAdminAdmin01 proxied 200"},
		{name: "forbidden", method: http.MethodDelete, path: "/v1/monitors/m1", auth: bearer("ViewerViewerViewer0001"),
			want: "org-1 ViewerViewerViewer0001 forbidden 403"},
		{name: "feature_gated", path: "/v1/me", auth: bearer("FreeAdminFreeAdmin0001"), want: "org-3 FreeAdminFreeAdmin0001 feature_gated 403"},
		{name: "rate_limited", path: "/v1/me", auth: bearer("TinyViewerTinyViewer01"), used: 3, want: "org-2 TinyViewerTinyViewer01 rate_limited 429"},
		{name: "limiter_unavailable", path: "/v1/me", auth: bearer("AdminAdminAdminAdmin01"), limiterFailure: "closed",
			want: "org-1 AdminAdminAdminAdmin01 limiter_unavailable 503"},
		{name: "quota_exceeded", path: "/v1/monitors", auth: bearer(quotaKey), used: 2, want: "org-6 QuotaViewerQuotaView01 quota_exceeded 402"},
		{name: "rate_limited by the org's minute", path: "/v1/monitors", auth: bearer(orgCeiling), used: 3, want: "org-5 OrgCeilingViewer000001 rate_limited 429"},
		{name: "ip_denied", path: "/v1/monitors", auth: bearer(restricted), want: "org-1 RestrictedAdminRestr01 ip_denied 401"},
		{name: "no key: not counted", path: "/v1/me"},
		{name: "unknown key: not counted", path: "/v1/me", auth: bearer("UnknownUnknownUnknown1")},
		{name: "wrong secret: not counted", path: "/v1/me", auth: "Bearer mon_live_AdminAdminAdminAdmin01." + strings.Repeat("x", 43)},
		{name: "lookup failed: not counted", path: "/v1/me", auth: bearer("AdminAdminAdminAdmin01"), verifierErr: errors.New("postgres down")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestHandler(t, &fakeVerifier{err: tc.verifierErr}, tc.limiterFailure)
			if routes != nil {
				h.routes = routetable.New(routes)
			}
			counted := &countedRows{}
			h.usage = counted
			start := time.Now()
			method := cmp.Or(tc.method, http.MethodGet)
			r := httptest.NewRequest(method, "http://gw"+tc.path, tc.body)
			if tc.auth != "" {
				r.Header.Set("Authorization", tc.auth)
			}
			if keyID, _, ok := bearerKey(r.Header, h.format); ok {
				spend(t, h, keyID, tc.used)
			}
			next := caddyhttp.HandlerFunc(func(w http.ResponseWriter, r *http.Request) error {
				if tc.upstream != nil {
					return tc.upstream(w, r)
				}
				return jsonUpstream(w, r)
			})
			w := httptest.NewRecorder()
			if err := h.ServeHTTP(w, r, next); err != nil {
				t.Fatalf("ServeHTTP: %v", err)
			}
			end := time.Now()
			var want []string
			var wantUnits []int
			if tc.want != "" {
				want = []string{tc.want}
				if status := strings.Fields(tc.want)[3]; fmt.Sprint(w.Code) != status {
					t.Errorf("the client got %d, the row says %s", w.Code, status)
				}
				// Decided before the route is weighed: the key's networks, its API access.
				units := cost
				if o := strings.Fields(tc.want)[2]; o == keystore.OutcomeIPDenied.String() || o == keystore.OutcomeFeatureGated.String() {
					units = 1
				}
				wantUnits = []int{units}
			}
			if tc.want != "" {
				// A refusal after a lookup is counted once its second look is done.
				testenv.Eventually(t, 5*time.Second, "a row counted", func() bool { return len(counted.snapshot()) > 0 })
			}
			counted.mu.Lock()
			defer counted.mu.Unlock()
			if !slices.Equal(counted.rows, want) {
				t.Errorf("counted %q, want %q", counted.rows, want)
			}
			if !slices.Equal(counted.units, wantUnits) {
				t.Errorf("counted units %v, want %v", counted.units, wantUnits)
			}
			for _, at := range counted.at {
				if at.Before(start) || at.After(end) {
					t.Errorf("counted at %v, outside the request's time", at)
				}
			}
		})
	}
}

// TestUsageCountsAResponseCutShort: a response aborted once its status is out (the
// reverse proxy panics with http.ErrAbortHandler when the upstream's body breaks, the
// filter when the upstream's JSON does) is counted with that status.
func TestUsageCountsAResponseCutShort(t *testing.T) {
	for _, tc := range []struct {
		name     string
		upstream upstream
	}{
		{"the reverse proxy aborts", func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"data":[`)
			panic(http.ErrAbortHandler)
		}},
		{"the filter aborts", func(w http.ResponseWriter, _ *http.Request) error {
			w.Header().Set("Content-Type", "application/json")
			_, err := io.WriteString(w, `{"data":[1,2`)
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestHandler(t, &fakeVerifier{}, "")
			counted := &countedRows{}
			h.usage = counted
			r := httptest.NewRequest(http.MethodGet, "http://gw/v1/monitors", nil)
			r.Header.Set("Authorization", bearer("EditorEditorEditor0001"))
			func() {
				defer func() {
					if p := recover(); p != http.ErrAbortHandler {
						t.Errorf("recovered %v, want http.ErrAbortHandler", p)
					}
				}()
				_ = h.ServeHTTP(httptest.NewRecorder(), r, caddyhttp.HandlerFunc(tc.upstream))
			}()
			if want := []string{"org-1 EditorEditorEditor0001 proxied 200"}; !slices.Equal(counted.rows, want) {
				t.Errorf("counted %q, want %q", counted.rows, want)
			}
		})
	}
}

// usageTotals returns usage_minutes summed over the minutes, as "key outcome status
// count" lines in that order.
func (d *db) usageTotals() []string {
	d.t.Helper()
	rows, err := d.pool.Query(context.Background(), `SELECT key_id, outcome, status, sum(count)::bigint FROM usage_minutes
		GROUP BY 1, 2, 3 ORDER BY key_id COLLATE "C", outcome COLLATE "C", status`)
	if err != nil {
		d.t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var key, outcome string
		var status int16
		var n int64
		if err := rows.Scan(&key, &outcome, &status, &n); err != nil {
			d.t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("%s %s %d %d", key, outcome, status, n))
	}
	if err := rows.Err(); err != nil {
		d.t.Fatal(err)
	}
	return out
}

// wantUsage checks usageTotals.
func (d *db) wantUsage(what string, want ...string) {
	d.t.Helper()
	if got := d.usageTotals(); !slices.Equal(got, want) {
		d.t.Errorf("%s: usage_minutes holds\n%s\nwant\n%s", what, strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// usageEntries returns the references of the usage recorders in pools.
func usageEntries() map[string]int {
	out := map[string]int{}
	for key, n := range poolEntries() {
		if strings.HasPrefix(key, "usage\x00") {
			out[key] = n
		}
	}
	return out
}

// serveAll sends each "METHOD path" with key through gw and checks the status.
func serveAll(t *testing.T, gw *gateway, key string, status int, requests ...string) {
	t.Helper()
	for _, rq := range requests {
		method, path, _ := strings.Cut(rq, " ")
		if res, body := gw.do(t, method, path, "Bearer "+key, nil, ""); res.StatusCode != status {
			t.Fatalf("%s: %d %s, want %d", rq, res.StatusCode, body, status)
		}
	}
}

// TestUsageSurvivesReloadsAndIsWrittenWhenItsLastHandlerGoes runs with an hour's
// interval, so that only the flush of a recorder being stopped can write: a reload
// that keeps the settings keeps the recorder and its counts, one that changes them
// writes the old recorder's counts, and the last handler's going writes the rest.
func TestUsageSurvivesReloadsAndIsWrittenWhenItsLastHandlerGoes(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	key, id := d.key(org, keystore.RoleEditor)
	up := newUpstream(t)
	dbURL := d.ownURL(t)
	gc := gatewayConfig{handler: gatewayOptions(dbURL, map[string]any{"usage_flush_interval": "1h"}), upstream: up.addr()}
	gw := startGateway(t, gc)
	listen := strings.TrimPrefix(gw.base, "http://")
	serveAll(t, gw, key, http.StatusOK, "GET /v1/me", "GET /v1/monitors")
	for range 3 {
		gw.reload(t, caddyConfig(listen, gw.logPath, gc))
		serveAll(t, gw, key, http.StatusOK, "GET /v1/me")
	}
	if got := usageEntries(); len(got) != 1 || slices.Collect(maps.Values(got))[0] != 1 {
		t.Errorf("usage recorders after 3 reloads: %v, want one, held once", got)
	}
	d.wantUsage("before any recorder stopped")

	// A new interval: a new recorder; the old one writes what it holds as it goes.
	gc.handler["usage_flush_interval"] = "2h"
	gw.reload(t, caddyConfig(listen, gw.logPath, gc))
	d.wantUsage("after a reload that replaced the recorder",
		id+" me 200 4",
		id+" proxied 200 1")
	serveAll(t, gw, key, http.StatusOK, "GET /v1/monitors", "HEAD /v1/me")
	serveAll(t, gw, key, http.StatusNotFound, "GET /v1/nowhere")

	// No gateway left: the last handler's Cleanup writes the rest.
	gw.reload(t, caddyConfig(listen, gw.logPath, gatewayConfig{upstream: up.addr()}))
	if got := usageEntries(); len(got) != 0 {
		t.Errorf("a usage recorder outlived its last handler: %v", got)
	}
	d.wantUsage("after the last handler went",
		id+" me 200 5",
		id+" proxied 200 2",
		id+" proxied 404 1")
	if sharedPool(dbURL) != nil {
		t.Error("the postgres pool outlived its last handler")
	}
}

func TestUsageOffRecordsNothing(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, map[string]any{"disable_usage": true}), upstream: up.addr()})
	serveAll(t, gw, key, http.StatusOK, "GET /v1/me", "GET /v1/monitors")
	if got := usageEntries(); len(got) != 0 {
		t.Errorf("usage off started recorders: %v", got)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	d.wantUsage("with usage off")
}

// refuseUsageWrites makes PostgreSQL refuse every write to usage_minutes, with an
// error of its own, until the returned function is called; key lookups go on.
func (d *db) refuseUsageWrites() (restore func()) {
	d.t.Helper()
	ctx := context.Background()
	if _, err := d.pool.Exec(ctx, `ALTER TABLE usage_minutes ADD CONSTRAINT refused CHECK (false) NOT VALID`); err != nil {
		d.t.Fatal(err)
	}
	return func() {
		if _, err := d.pool.Exec(ctx, `ALTER TABLE usage_minutes DROP CONSTRAINT refused`); err != nil {
			d.t.Fatal(err)
		}
	}
}

// TestUsageIsHeldWhilePostgresRefusesItAndDroppedBeyondTheBuffer: with a buffer of
// two rows, the counts of two rows are held through failed flushes and written once
// PostgreSQL takes them; the requests of a third row are dropped and counted in
// keygate_usage_dropped_total.
func TestUsageIsHeldWhilePostgresRefusesItAndDroppedBeyondTheBuffer(t *testing.T) {
	d := newDB(t)
	org := d.org("pro")
	editor, editorID := d.key(org, keystore.RoleEditor)
	viewer, _ := d.key(org, keystore.RoleViewer)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(d.url, map[string]any{"usage_flush_interval": "1s", "usage_buffer": 2}),
		upstream: up.addr(), metrics: true,
	})
	pinClock(t, time.Now()) // every request in one minute: one row each
	before := gw.scrape(t)
	restore := d.refuseUsageWrites()
	serveAll(t, gw, editor, http.StatusOK, "GET /v1/me", "GET /v1/me", "GET /v1/monitors")
	serveAll(t, gw, viewer, http.StatusForbidden, "POST /v1/monitors", "DELETE /v1/monitors/m1") // a third row
	testenv.Eventually(t, 10*time.Second, "two failed flushes at an interval of 1s", func() bool {
		return gw.scrape(t)[metricUsageErrors]-before[metricUsageErrors] >= 2
	})
	serveAll(t, gw, editor, http.StatusOK, "GET /v1/me") // a row held: counted
	d.wantUsage("while PostgreSQL refuses the writes")
	wantSeries(t, before, gw.scrape(t), map[string]float64{metricUsageDropped: 2})

	restore()
	testenv.Eventually(t, 10*time.Second, "the held rows written", func() bool { return len(d.usageTotals()) >= 2 })
	d.wantUsage("once PostgreSQL takes the writes",
		editorID+" me 200 3",
		editorID+" proxied 200 1")
	wantSeries(t, before, gw.scrape(t), map[string]float64{metricUsageDropped: 2})
}

// TestUsageOptionsDefaultsAndLimits: the defaults, and the JSON values Validate refuses
// (the Caddyfile parser refuses them at their line).
func TestUsageOptionsDefaultsAndLimits(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts map[string]any
		want string
	}{
		{"usage_flush_interval too short", map[string]any{"usage_flush_interval": "500ms"}, "usage_flush_interval 500ms: must be at least 1s"},
		{"usage_flush_interval negative", map[string]any{"usage_flush_interval": -1}, "usage_flush_interval -1ns: must be at least 1s"},
		{"usage_buffer negative", map[string]any{"usage_buffer": -1}, "usage_buffer -1: must be positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Handler{DatabaseURL: "postgres://unused", GatewaySecret: testSecret}
			b, _ := json.Marshal(tc.opts)
			if err := json.Unmarshal(b, &h); err != nil {
				t.Fatal(err)
			}
			if err := h.configure(zap.NewNop()); err == nil || err.Error() != tc.want {
				t.Errorf("error %v, want %q", err, tc.want)
			}
		})
	}
	h := Handler{DatabaseURL: "postgres://unused", GatewaySecret: testSecret}
	if err := h.configure(zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	if time.Duration(h.UsageFlushInterval) != 10*time.Second || h.UsageBuffer != 100_000 || h.DisableUsage {
		t.Errorf("defaults: usage_flush_interval %v, usage_buffer %d, disable_usage %v; want 10s, 100000, false",
			time.Duration(h.UsageFlushInterval), h.UsageBuffer, h.DisableUsage)
	}
}
