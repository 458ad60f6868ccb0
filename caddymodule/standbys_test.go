package caddymodule

import (
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// TestStandbyOptionsParse: database_read_urls takes one or more URLs, once;
// database_read_max_lag one positive duration, once.
func TestStandbyOptionsParse(t *testing.T) {
	var h Handler
	in := "v1_gateway {\n\tdatabase_read_urls postgres://a/k postgres://b/k\n\tdatabase_read_max_lag 250ms\n}"
	if err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(in)); err != nil {
		t.Fatal(err)
	}
	want := Handler{DatabaseReadURLs: []string{"postgres://a/k", "postgres://b/k"}, DatabaseReadMaxLag: caddy.Duration(250 * time.Millisecond)}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("got %+v, want %+v", h, want)
	}
	for _, tc := range []struct{ name, input, want string }{
		{"database_read_urls without a URL", "v1_gateway {\n\tdatabase_read_urls\n}", "wrong argument count"},
		{"database_read_urls twice", "v1_gateway {\n\tdatabase_read_urls a\n\tdatabase_read_urls b\n}", "database_read_urls already specified"},
		{"database_read_max_lag twice", "v1_gateway {\n\tdatabase_read_max_lag 1s\n\tdatabase_read_max_lag 2s\n}", "database_read_max_lag already specified"},
		{"database_read_max_lag without a duration", "v1_gateway {\n\tdatabase_read_max_lag\n}", "wrong argument count"},
		{"database_read_max_lag zero", "v1_gateway {\n\tdatabase_read_max_lag 0\n}", "database_read_max_lag must be positive"},
		{"database_read_max_lag not a duration", "v1_gateway {\n\tdatabase_read_max_lag soon\n}", "parsing database_read_max_lag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			line := strings.Count(tc.input, "\n")
			if at := ", at Testfile:" + strconv.Itoa(line); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), at) {
				t.Errorf("error %v, want %q…%s", err, tc.want, at)
			}
		})
	}
}

// TestStandbyOptionsDefaultsAndLimits: the default lag, and the JSON values Validate
// refuses.
func TestStandbyOptionsDefaultsAndLimits(t *testing.T) {
	t.Setenv("KEYGATE_TEST_UNSET_STANDBY", "")
	for _, tc := range []struct {
		name string
		opts map[string]any
		want string
	}{
		{"negative lag", map[string]any{"database_read_max_lag": -1}, "database_read_max_lag -1ns: must be positive"},
		{"unbatched lookups", map[string]any{"database_read_urls": []string{"postgres://standby/k"}, "disable_lookup_batching": true},
			"database_read_urls needs batched lookups: remove disable_lookup_batching"},
		{"an empty placeholder", map[string]any{"database_read_urls": []string{"postgres://standby/k", "{env.KEYGATE_TEST_UNSET_STANDBY}"}},
			`database_read_urls "{env.KEYGATE_TEST_UNSET_STANDBY}" is empty once its placeholders are replaced (is the environment variable set?)`},
		{"the primary as a standby", map[string]any{"database_read_urls": []string{"postgres://unused"}},
			"database_read_urls: a standby's URL is database_url's; name the primary in database_url only"},
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
	if time.Duration(h.DatabaseReadMaxLag) != time.Second || h.DatabaseReadURLs != nil {
		t.Errorf("defaults: database_read_max_lag %v, database_read_urls %v; want 1s and none", time.Duration(h.DatabaseReadMaxLag), h.DatabaseReadURLs)
	}
}

// readerEntries returns the Readers pools holds, by key.
func readerEntries() map[string]*keystore.Reader {
	out := map[string]*keystore.Reader{}
	pools.Range(func(key, v any) bool {
		if e, ok := v.(readerEntry); ok {
			out[key.(string)] = e.r
		}
		return true
	})
	return out
}

// TestStandbysSurviveAReload: a reload with the same database_read_urls keeps the
// Reader, its standbys' pools and their health; a reload without them closes both.
func TestStandbysSurviveAReload(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	standby, err := url.Parse(testenv.GetenvOrSkip(t, "DATABASE_STANDBY_FAST_URL"))
	if err != nil {
		t.Fatal(err)
	}
	primary, _ := url.Parse(d.url)
	standby.Path = primary.Path
	standby.RawQuery = "application_name=" + randomName(t) // a pool of the test's own
	up := newUpstream(t)
	dbURL := d.ownURL(t)
	reads := gatewayConfig{handler: gatewayOptions(dbURL, map[string]any{"database_read_urls": []string{standby.String()}}), upstream: up.addr()}
	gw := startGateway(t, reads)
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/me: %d %s", res.StatusCode, body)
	}
	before := readerEntries()
	if len(before) != 1 || sharedPool(standby.String()) == nil {
		t.Fatalf("after the first load: readers %v, standby pool %v", before, sharedPool(standby.String()))
	}
	listen := strings.TrimPrefix(gw.base, "http://")
	gw.reload(t, caddyConfig(listen, gw.logPath, reads))
	if after := readerEntries(); !reflect.DeepEqual(after, before) {
		t.Errorf("a reload with the same settings changed the Readers: %v, then %v", before, after)
	}
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/me after the reload: %d %s", res.StatusCode, body)
	}
	gw.reload(t, caddyConfig(listen, gw.logPath, gatewayConfig{handler: gatewayOptions(dbURL, nil), upstream: up.addr()}))
	if after := readerEntries(); len(after) != 0 || sharedPool(standby.String()) != nil {
		t.Errorf("a reload without database_read_urls kept readers %v, standby pool %v", after, sharedPool(standby.String()))
	}
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/me without standbys: %d %s", res.StatusCode, body)
	}
}

// TestStandbyLogTellsAFlappingStandbyOnceAMinute: a standby's first change is logged
// at once, at info when it comes in; the changes right after it are held (the minute
// of internal/flaplog's own tests), and never log a line each.
func TestStandbyLogTellsAFlappingStandbyOnceAMinute(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	l := standbyLog(zap.New(core), "standby1:5432")
	for i := range 10 {
		l.Change(i%2 == 0) // in, out, in, … as a standby crossing database_read_max_lag
	}
	entries := logs.AllUntimed()
	if len(entries) != 1 {
		t.Fatalf("logged %d lines for 10 changes within a minute, want 1: %v", len(entries), entries)
	}
	e := entries[0]
	if e.Level != zapcore.InfoLevel || e.Message != "standby takes key lookups" ||
		e.ContextMap()["standby"] != "standby1:5432" || e.ContextMap()["changes"] != int64(1) {
		t.Errorf("first line: %v %q %v, want info \"standby takes key lookups\" standby=standby1:5432 changes=1",
			e.Level, e.Message, e.ContextMap())
	}
}

// TestStandbyUpFollowsTheStandby: keygate_standby_up is 1 while the standby takes
// lookups, 0 once it hangs and is left out, 1 again once it answers, and gone with
// the config that named it.
func TestStandbyUpFollowsTheStandby(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	standby, err := url.Parse(testenv.GetenvOrSkip(t, "DATABASE_STANDBY_FAST_URL"))
	if err != nil {
		t.Fatal(err)
	}
	primary, _ := url.Parse(d.url)
	standby.Path = primary.Path
	standby.RawQuery = "application_name=" + randomName(t)
	proxy := newLatencyProxy(t, standby.Host)
	t.Cleanup(proxy.Resume)
	standby.Host = proxy.Addr()
	up := newUpstream(t)
	dbURL := d.ownURL(t)
	// The standby replays every test database the packages create beside this test,
	// seconds behind on a loaded machine: a lag of a minute keeps it in while it
	// answers (as keystore's standby tests do). A hang leaves it out whatever the lag.
	reads := gatewayConfig{metrics: true, upstream: up.addr(), handler: gatewayOptions(dbURL, map[string]any{
		"database_read_urls": []string{standby.String()}, "database_timeout": "500ms", "database_dial_timeout": "500ms",
		"database_read_max_lag": "1m"})}
	gw := startGateway(t, reads)
	series := `keygate_standby_up{standby="` + proxy.Addr() + `"}`
	wantUp := func(what string, want float64) {
		t.Helper()
		var got map[string]float64
		testenv.Eventually(t, 20*time.Second, series+" "+what, func() bool {
			got = gw.scrape(t)
			v, ok := got[series]
			return ok && v == want
		})
	}
	wantUp("once its probe found it caught up", 1)
	proxy.Hang()
	wantUp("while it hangs", 0)
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/me with the standby left out: %d %s", res.StatusCode, body)
	}
	proxy.Resume()
	wantUp("once it answers again", 1)

	listen := strings.TrimPrefix(gw.base, "http://")
	gw.reload(t, caddyConfig(listen, gw.logPath, gatewayConfig{metrics: true, handler: gatewayOptions(dbURL, nil), upstream: up.addr()}))
	if v, ok := gw.scrape(t)[series]; ok {
		t.Errorf("%s = %v after a reload without database_read_urls, want no series", series, v)
	}
}
