package caddymodule

// The harness of the in-process tests: a fresh PostgreSQL database, a test upstream,
// Caddy loaded in this process with a JSON config, and TCP fault injection.
//
// Caddy has one running config per process. So the tests that load one do not run in
// parallel.

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	_ "github.com/caddyserver/caddy/v2/modules/standard"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/redistest"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

// testSecret is the gateway_secret of the tests.
const testSecret = "s3cret-gateway-value-for-tests"

// redisURL returns REDIS_URL, failing the test when it is not set.
func redisURL(t testing.TB) string { return redistest.URL(t) }

// db is a fresh migrated database with helpers to create orgs, plans and keys.
type db struct {
	t     *testing.T
	pool  *pgxpool.Pool
	url   string
	store *keystore.Store
}

func newDB(t *testing.T) *db {
	t.Helper()
	pool, url := schematest.NewPool(t)
	return &db{t: t, pool: pool, url: url, store: keystore.New(pool, keystoretest.Format(t, "mon"))}
}

// newDBWithKey returns a fresh database holding an org on plan pro with an Editor
// key. It returns the key in full, with its id: what a test of one key needs before
// it starts.
func newDBWithKey(t *testing.T) (d *db, key, id string) {
	t.Helper()
	d = newDB(t)
	key, id = d.key(d.org("pro"), keystore.RoleEditor)
	return d, key, id
}

// plan creates a plan with the given api_rate_limit.
func (d *db) plan(name string, apiRateLimit int) {
	d.t.Helper()
	_, err := d.pool.Exec(context.Background(), `INSERT INTO plans (name, api_rate_limit, max_monitors, min_interval_seconds, locations, check_types)
VALUES ($1, $2, 10, 60, ARRAY['us-east'], ARRAY['http'])`, name, apiRateLimit)
	if err != nil {
		d.t.Fatal(err)
	}
}

// org creates an organisation on plan and returns its id.
func (d *db) org(plan string) string {
	d.t.Helper()
	var id string
	err := d.pool.QueryRow(context.Background(),
		`INSERT INTO orgs (name, plan) VALUES ('acme', $1) RETURNING id::text`, plan).Scan(&id)
	if err != nil {
		d.t.Fatal(err)
	}
	return id
}

// key creates a key and returns the full key and its id.
func (d *db) key(org string, role keystore.Role) (full, id string) {
	d.t.Helper()
	rec, full, err := d.store.Create(context.Background(), keystore.NewKey{OrgID: org, Name: "test", Role: role})
	if err != nil {
		d.t.Fatal(err)
	}
	return full, rec.ID
}

// seenRequest is what the test upstream saw of a request.
type seenRequest struct {
	Method string      `json:"method"`
	Path   string      `json:"path"`
	Header http.Header `json:"header"`
}

// testUpstream is the upstream of the tests: an httptest.Server with one route per
// behaviour the gateway must handle.
type testUpstream struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seenRequest
	// release unblocks /v1/stream once the client has seen its first bytes.
	release chan struct{}
}

const monitorJSON = `{"id":"m1","name":"api","type":"http","target":"https://example.com","interval_seconds":60,"locations":["us-east"],"paused":false,` +
	`"config":{"method":"GET","headers":{"X-Token":"t0p"}},"assertions":[{"type":"status","value":200}],"config_version":2,` +
	`"paused_reason":null,"org_id":"o1","deleted_at":null,"created_at":"2024-01-01T00:00:00Z","updated_at":"2024-01-01T00:00:00Z"}`

const monitorFiltered = `{"id":"m1","name":"api","type":"http","target":"https://example.com","interval_seconds":60,"locations":["us-east"],"paused":false,` +
	`"created_at":"2024-01-01T00:00:00Z","updated_at":"2024-01-01T00:00:00Z"}`

func newUpstream(t *testing.T) *testUpstream {
	u := &testUpstream{release: make(chan struct{})}
	mux := http.NewServeMux()
	json200 := func(w http.ResponseWriter, body string) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = io.WriteString(w, body)
	}
	mux.HandleFunc("/v1/echo", func(w http.ResponseWriter, r *http.Request) {
		b, _ := json.Marshal(seenRequest{Method: r.Method, Path: r.URL.Path, Header: r.Header})
		json200(w, string(b))
	})
	mux.HandleFunc("/v1/upload", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return // the gateway gave up sending it
		}
		json200(w, fmt.Sprintf(`{"read":%d}`, n))
	})
	// /auth/login stands for the dashboard's routes: it reads the whole body first.
	mux.HandleFunc("/auth/login", func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			return
		}
		json200(w, fmt.Sprintf(`{"read":%d}`, n))
	})
	mux.HandleFunc("/v1/me", func(w http.ResponseWriter, r *http.Request) {
		json200(w, `{"upstream":"me","method":"`+r.Method+`"}`)
	})
	mux.HandleFunc("/v1/monitors", func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusCreated)
			_, _ = io.WriteString(w, monitorJSON)
			return
		}
		w.Header().Set("Etag", `"v1-list"`)
		json200(w, `{"data":[`+monitorJSON+`,`+monitorJSON+`],"next_cursor":null}`)
	})
	mux.HandleFunc("/v1/monitors/m1", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Etag", `"m1-v2"`)
		if r.Header.Get("If-None-Match") == `W/"m1-v2"` || r.Header.Get("If-None-Match") == `"m1-v2"` {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		w.Header().Set("Content-Type", "application/json; charset=utf-8")
		_, _ = io.WriteString(w, monitorJSON)
	})
	mux.HandleFunc("/v1/compressed/", func(w http.ResponseWriter, r *http.Request) {
		coding := strings.TrimPrefix(r.URL.Path, "/v1/compressed/")
		var buf bytes.Buffer
		switch coding {
		case "gzip-corrupt":
			coding = "gzip"
			zw := gzip.NewWriter(&buf)
			_, _ = io.WriteString(zw, monitorJSON)
			zw.Close()
			b := buf.Bytes()
			copy(b[len(b)/2:], "garbage garbage garbage") // a corrupt deflate stream
		case "gzip":
			zw := gzip.NewWriter(&buf)
			_, _ = io.WriteString(zw, monitorJSON)
			zw.Close()
		case "deflate":
			zw := zlib.NewWriter(&buf)
			_, _ = io.WriteString(zw, monitorJSON)
			zw.Close()
		default:
			buf.WriteString("\x1b\x2f\x00not really brotli")
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Encoding", coding)
		w.Header().Set("Content-Length", fmt.Sprint(buf.Len()))
		_, _ = w.Write(buf.Bytes())
	})
	mux.HandleFunc("/v1/untyped", func(w http.ResponseWriter, r *http.Request) {
		w.Header()["Content-Type"] = nil // no Content-Type, not even a sniffed one
		_, _ = io.WriteString(w, monitorJSON)
	})
	mux.HandleFunc("/v1/text", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Length", "24")
		_, _ = io.WriteString(w, `{"config":"not json, ok"}`[:24])
	})
	mux.HandleFunc("/v1/text-error", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, "<h1>stack trace with config secrets</h1>")
	})
	mux.HandleFunc("/v1/json-error", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusConflict)
		_, _ = io.WriteString(w, `{"error":"conflict","org_id":"o1"}`)
	})
	// Bodies whose Content-Type does not say what they are.
	mux.HandleFunc("/v1/mislabelled/", func(w http.ResponseWriter, r *http.Request) {
		body := monitorJSON
		switch strings.TrimPrefix(r.URL.Path, "/v1/mislabelled/") {
		case "text":
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		case "octet-stream":
			w.Header().Set("Content-Type", "application/octet-stream")
		case "untyped-bom":
			w.Header()["Content-Type"] = nil
			body = "\xef\xbb\xbf \n" + monitorJSON
		case "two-types":
			w.Header()["Content-Type"] = []string{"text/plain", "application/json"}
		case "two-types-reversed":
			w.Header()["Content-Type"] = []string{"application/json", "text/plain"}
		case "upper-case":
			w.Header().Set("Content-Type", "application/json")
			body = strings.NewReplacer(`"config"`, `"Config"`, `"org_id"`, `"ORG_ID"`, `"assertions"`, `"aſſertions"`).Replace(monitorJSON)
		case "not-json":
			w.Header().Set("Content-Type", "text/plain")
			body = `{"config": this is not JSON}`
		case "not-json-bom":
			w.Header()["Content-Type"] = nil
			body = "\xef\xbb\xbfplain text"
		}
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		_, _ = io.WriteString(w, body)
	})
	mux.HandleFunc("/v1/invalid-json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"m1","name":"x" "config":{"secret":1}}`)
	})
	mux.HandleFunc("/v1/truncated-json", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"m1","data":[1,2`)
	})
	mux.HandleFunc("/v1/ratelimit-spoof", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Ratelimit", `"default";r=999;t=1`)
		w.Header().Set("Ratelimit-Policy", `"default";q=999;w=60`)
		json200(w, `{}`)
	})
	mux.HandleFunc("/v1/slow", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second):
		case <-r.Context().Done():
		}
		json200(w, `{}`)
	})
	mux.HandleFunc("/v1/stream", func(w http.ResponseWriter, r *http.Request) {
		// 2 MB of monitors, then a pause until the test has read the start of the
		// response. A gateway that buffered the whole body would never send it.
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[`+monitorJSON)
		for range 2000 {
			_, _ = io.WriteString(w, ","+monitorJSON)
		}
		w.(http.Flusher).Flush()
		select {
		case <-u.release:
		case <-time.After(10 * time.Second):
		}
		_, _ = io.WriteString(w, `],"next_cursor":null}`)
	})
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.seen = append(u.seen, seenRequest{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone()})
		u.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(u.Close)
	return u
}

// requests returns how many requests the upstream has seen.
func (u *testUpstream) requests() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.seen)
}

// addr returns host:port of the upstream.
func (u *testUpstream) addr() string { return strings.TrimPrefix(u.URL, "http://") }

// freeAddr returns a loopback address nothing listens on (at the time of the call).
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

// gatewayConfig is what a test varies in the Caddy config.
type gatewayConfig struct {
	handler      map[string]any // the v1_gateway handler's options; nil: no gateway
	upstream     string         // dial address of the reverse proxy
	proxyTimeout string         // the reverse proxy's response_header_timeout
	accessLog    bool           // enable the server's access log
	logCreds     bool           // should_log_credentials
	// filterSecret deletes X-Gateway-Secret from logged request headers, as the example
	// Caddyfile does. The reverse proxy logs the headers it sends upstream.
	filterSecret bool
	// metrics serves Caddy's metrics handler at /metrics, beside /v1 (metrics_test.go).
	metrics bool
	// maxBody, if not 0, is the max_size in bytes of a request_body handler before
	// the gateway.
	maxBody int
	// passiveHealth has the reverse proxy take its upstream out of rotation for 30 s
	// after one failure (passive health checks, max_fails 1).
	passiveHealth bool
	// trustedProxies, if not empty, are the server's trusted_proxies (static ranges);
	// trustedStrict sets its trusted_proxies_strict.
	trustedProxies []string
	trustedStrict  bool
}

// gateway is a running in-process Caddy.
type gateway struct {
	base    string
	logPath string
	client  *http.Client
}

// caddyConfig builds the JSON config of the tests, as the example Caddyfile does.
// /v1/* goes through v1_gateway, then the reverse proxy. Everything else goes
// straight to the reverse proxy.
func caddyConfig(listen, logPath string, gc gatewayConfig) []byte {
	handler := map[string]any{"handler": "v1_gateway"}
	for k, v := range gc.handler {
		handler[k] = v
	}
	proxy := map[string]any{
		"handler":   "reverse_proxy",
		"upstreams": []any{map[string]any{"dial": gc.upstream}},
	}
	if gc.proxyTimeout != "" {
		proxy["transport"] = map[string]any{"protocol": "http", "response_header_timeout": gc.proxyTimeout}
	}
	if gc.passiveHealth {
		proxy["health_checks"] = map[string]any{"passive": map[string]any{"fail_duration": "30s", "max_fails": 1}}
	}
	v1 := []any{handler, proxy}
	if gc.handler == nil {
		v1 = []any{proxy} // no gateway at all
	}
	if gc.maxBody != 0 {
		v1 = append([]any{map[string]any{"handler": "request_body", "max_size": gc.maxBody}}, v1...)
	}
	server := map[string]any{
		"listen":          []any{listen},
		"automatic_https": map[string]any{"disable": true},
		"routes": []any{
			map[string]any{
				"match":    []any{map[string]any{"path": []any{"/v1/*"}}},
				"handle":   v1,
				"terminal": true,
			},
			map[string]any{"handle": []any{proxy}},
		},
	}
	if gc.metrics {
		server["routes"] = append([]any{map[string]any{
			"match":    []any{map[string]any{"path": []any{"/metrics"}}},
			"handle":   []any{map[string]any{"handler": "metrics"}},
			"terminal": true,
		}}, server["routes"].([]any)...)
	}
	if len(gc.trustedProxies) > 0 {
		server["trusted_proxies"] = map[string]any{"source": "static", "ranges": gc.trustedProxies}
	}
	if gc.trustedStrict {
		server["trusted_proxies_strict"] = 1
	}
	if gc.accessLog {
		server["logs"] = map[string]any{"should_log_credentials": gc.logCreds}
	}
	encoder := map[string]any{"format": "json"}
	if gc.filterSecret {
		encoder = map[string]any{
			"format": "filter",
			"wrap":   encoder,
			"fields": map[string]any{"request>headers>X-Gateway-Secret": map[string]any{"filter": "delete"}},
		}
	}
	cfg := map[string]any{
		"admin": map[string]any{"disabled": true, "config": map[string]any{"persist": false}},
		"logging": map[string]any{"logs": map[string]any{"default": map[string]any{
			"writer":  map[string]any{"output": "file", "filename": logPath},
			"encoder": encoder,
			"level":   "INFO",
		}}},
		"apps": map[string]any{"http": map[string]any{"servers": map[string]any{"gw": server}}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		panic(err)
	}
	return b
}

// reload loads cfg into the running Caddy, as a config reload does. It makes the
// gateway's client start on fresh connections. A reload closes the old server's idle
// keep-alive connections, and a client reusing one races with that close (connection
// reset, EOF). That is Caddy's reload, not what the tests are about.
func (g *gateway) reload(t testing.TB, cfg []byte) {
	t.Helper()
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("reloading: %v", err)
	}
	g.client.CloseIdleConnections()
	// A connection caught in the listener's handover is reset too. Wait until a request
	// gets an HTTP answer, of any status, from the new config.
	testenv.Eventually(t, 10*time.Second, "an answer after the reload", func() bool {
		res, err := g.client.Get(g.base + "/")
		if err != nil {
			return false
		}
		io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return true
	})
}

// startGateway loads a config running v1_gateway in this process and stops it when
// the test ends.
func startGateway(t *testing.T, gc gatewayConfig) *gateway {
	t.Helper()
	g := &gateway{logPath: filepath.Join(t.TempDir(), "caddy.log")}
	listen := freeAddr(t)
	if err := caddy.Load(caddyConfig(listen, g.logPath, gc), true); err != nil {
		t.Fatalf("loading caddy config: %v", err)
	}
	t.Cleanup(func() {
		if err := caddy.Stop(); err != nil {
			t.Errorf("stopping caddy: %v", err)
		}
		if t.Failed() {
			b, _ := os.ReadFile(g.logPath)
			t.Logf("caddy log:\n%s", b)
		}
	})
	g.base = "http://" + listen
	g.client = &http.Client{
		Timeout: 15 * time.Second,
		// DisableCompression: see exactly what the gateway sends.
		Transport: &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 8},
		// Redirects are answers too.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	return g
}

// gatewayOptions returns the v1_gateway options of a test: its database, the test
// Redis, the test secret.
func gatewayOptions(dbURL string, extra map[string]any) map[string]any {
	opts := map[string]any{
		"database_url":   dbURL,
		"gateway_secret": testSecret,
	}
	for k, v := range extra {
		opts[k] = v
	}
	return opts
}

// do sends a request through the gateway; auth, if not empty, is the whole
// Authorization header value.
func (g *gateway) do(t testing.TB, method, path, auth string, hdr http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, g.base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, vv := range hdr {
		req.Header[k] = vv
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	return testenv.Exchange(t, g.client, req)
}

// get is do for a GET with a bearer key.
func (g *gateway) get(t testing.TB, path, key string) (*http.Response, []byte) {
	t.Helper()
	return g.do(t, http.MethodGet, path, "Bearer "+key, nil, "")
}

// logText returns what Caddy has logged so far.
func (g *gateway) logText(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(g.logPath)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// wantJSONError checks a response is a JSON error with the given status and body.
func wantJSONError(t testing.TB, res *http.Response, body []byte, status int, wantBody string) {
	t.Helper()
	if res.StatusCode != status {
		t.Errorf("status %d, want %d (body %s)", res.StatusCode, status, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if v := res.Header.Get("X-Content-Type-Options"); v != "nosniff" {
		t.Errorf("X-Content-Type-Options %q, want nosniff", v)
	}
	if string(body) != wantBody {
		t.Errorf("body %s, want %s", body, wantBody)
	}
}

// headerDump renders a response's status, headers and body, without Date, so that two
// responses can be compared byte for byte.
func headerDump(res *http.Response, body []byte) string {
	var names []string
	for k := range res.Header {
		if k != "Date" {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	fmt.Fprintf(&b, "%s %d\n", res.Proto, res.StatusCode)
	for _, k := range names {
		fmt.Fprintf(&b, "%s: %q\n", k, res.Header[k])
	}
	b.Write(body)
	return b.String()
}

// pinClock stops the module's clock at at until the test ends: the usage record's
// minute and the in-process limiter's window stay those of at, however long the test
// takes. Redis's windows follow Redis's clock, not this one.
func pinClock(t testing.TB, at time.Time) {
	t.Helper()
	now = func() time.Time { return at }
	t.Cleanup(func() { now = time.Now })
}

// awayFromWindowEdge waits, if needed, so that the next few seconds stay in one
// rate-limit window (windows are aligned to the UTC minute).
func awayFromWindowEdge(t testing.TB, need time.Duration) {
	t.Helper()
	now := time.Now()
	left := now.Truncate(time.Minute).Add(time.Minute).Sub(now)
	if left < need {
		t.Logf("waiting %v for a fresh rate-limit window", left)
		time.Sleep(left + 50*time.Millisecond) // a minute's start in Redis's clock: no event marks it
	}
}

// withHost returns url (postgres:// or redis://) with its host:port replaced.
func withHost(t testing.TB, url, hostport string) string {
	t.Helper()
	scheme, rest, ok := strings.Cut(url, "://")
	if !ok {
		t.Fatalf("bad url %q", url)
	}
	userinfo := ""
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		userinfo, rest = rest[:at+1], rest[at+1:]
	}
	end := strings.IndexAny(rest, "/?")
	if end < 0 {
		end = len(rest)
	}
	return scheme + "://" + userinfo + hostport + rest[end:]
}

// hostOf returns the host:port of a URL.
func hostOf(t testing.TB, url string) string {
	t.Helper()
	_, rest, _ := strings.Cut(url, "://")
	if at := strings.LastIndex(rest, "@"); at >= 0 {
		rest = rest[at+1:]
	}
	if end := strings.IndexAny(rest, "/?"); end >= 0 {
		rest = rest[:end]
	}
	return rest
}
