package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// testSecret is the gateway secret of every test server.
const testSecret = "test-gateway-secret-0123456789"

// testEnv is a Server on a fresh database behind an httptest.Server, with helpers to
// create fixtures and make requests.
type testEnv struct {
	t     *testing.T
	pool  *pgxpool.Pool
	dbURL string
	srv   *Server
	ts    *httptest.Server
	logs  *observer.ObservedLogs
	seq   atomic.Int64
}

// newTestEnv starts a Server on a fresh database; opts adjust its Config.
func newTestEnv(t *testing.T, opts ...func(*Config)) *testEnv {
	t.Helper()
	return newTestEnvOn(t, schematest.NewDatabase(t), opts...)
}

// newTestEnvOn starts a Server on the migrated database at dbURL.
func newTestEnvOn(t *testing.T, dbURL string, opts ...func(*Config)) *testEnv {
	t.Helper()
	pool := newTestPool(t, dbURL, DefaultDatabaseTimeout)
	return newTestEnvWith(t, pool, pool, dbURL, opts...)
}

// newTestPool opens a pool on dbURL configured as serve configures its own (poolConfig),
// closed when the test ends.
func newTestPool(t *testing.T, dbURL string, timeout time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := poolConfig(dbURL, 0, timeout)
	if err != nil {
		t.Fatal(err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// newTestEnvWith starts a Server on serverPool; the env's fixtures and queries use pool.
func newTestEnvWith(t *testing.T, pool, serverPool *pgxpool.Pool, dbURL string, opts ...func(*Config)) *testEnv {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	format, err := keystore.NewFormat("mon")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Pool: serverPool, Logger: zap.New(core), GatewaySecret: testSecret, KeyFormat: format}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	// No answer of the API is a redirect; a test must see one if it happens.
	ts.Client().CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &testEnv{t: t, pool: pool, dbURL: dbURL, srv: srv, ts: ts, logs: logs}
}

// org creates an organisation on planName and returns its id.
func (e *testEnv) org(planName string) string {
	e.t.Helper()
	o, err := createOrg(context.Background(), e.pool, fmt.Sprintf("org %d", e.seq.Add(1)), planName)
	if err != nil {
		e.t.Fatalf("creating org: %v", err)
	}
	return o.ID
}

// plan creates or replaces a plan.
func (e *testEnv) plan(p planRecord) {
	e.t.Helper()
	if _, err := putPlan(context.Background(), e.pool, p); err != nil {
		e.t.Fatalf("putting plan: %v", err)
	}
}

// setPlan moves orgID to planName.
func (e *testEnv) setPlan(orgID, planName string) {
	e.t.Helper()
	if _, err := setOrgPlan(context.Background(), e.pool, orgID, planName); err != nil {
		e.t.Fatalf("setting plan: %v", err)
	}
}

// user creates a user with a fresh email and returns the email and password.
func (e *testEnv) user() (email, password string) {
	e.t.Helper()
	n := e.seq.Add(1)
	email, password = fmt.Sprintf("user%d@example.com", n), fmt.Sprintf("password %d", n)
	if _, err := createUser(context.Background(), e.pool, e.srv.passwords, email, password); err != nil {
		e.t.Fatalf("creating user: %v", err)
	}
	return email, password
}

// member makes the user with email a member of orgID.
func (e *testEnv) member(orgID, email, role string) {
	e.t.Helper()
	if _, err := addMember(context.Background(), e.pool, orgID, email, role); err != nil {
		e.t.Fatalf("adding member: %v", err)
	}
}

// person creates a user with role in each of orgIDs and returns a client logged in as
// them.
func (e *testEnv) person(role string, orgIDs ...string) *client {
	e.t.Helper()
	email, password := e.user()
	for _, o := range orgIDs {
		e.member(o, email, role)
	}
	return e.login(email, password)
}

// login logs in and returns a client carrying the session cookie.
func (e *testEnv) login(email, password string) *client {
	e.t.Helper()
	anon := e.anon()
	r := anon.do("POST", "/auth/login", jsonBody(map[string]string{"email": email, "password": password}))
	if r.status != http.StatusNoContent {
		e.t.Fatalf("login: %d %s", r.status, r.body)
	}
	for _, c := range r.cookies() {
		if c.Name == sessionCookie {
			return &client{e: e, header: http.Header{"Cookie": {sessionCookie + "=" + c.Value}}}
		}
	}
	e.t.Fatal("login set no session cookie")
	return nil
}

// anon returns a client without credentials.
func (e *testEnv) anon() *client {
	return &client{e: e, header: http.Header{}}
}

// gateway returns a client that presents the headers the gateway adds for a key of
// role in orgID.
func (e *testEnv) gateway(orgID, role string) *client {
	return &client{e: e, header: http.Header{
		headerSecret:  {testSecret},
		headerOrgID:   {orgID},
		headerKeyID:   {"AAAAAAAAAAAAAAAAAAAAAA"},
		headerKeyRole: {role},
	}}
}

// client makes requests to the test server with fixed headers.
type client struct {
	e      *testEnv
	header http.Header
}

// with returns a copy of c with more headers, in "Name", "value" pairs.
func (c *client) with(kv ...string) *client {
	h := c.header.Clone()
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return &client{e: c.e, header: h}
}

// response is what a request answered.
type response struct {
	status int
	header http.Header
	body   string
}

func (r response) cookies() []*http.Cookie {
	return (&http.Response{Header: r.header}).Cookies()
}

// decode parses the body as JSON into v.
func (r response) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(r.body), v); err != nil {
		t.Fatalf("decoding %q: %v", r.body, err)
	}
}

// do makes a request; body "" sends none.
func (c *client) do(method, path, body string) response {
	c.e.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, c.e.ts.URL+path, rd)
	if err != nil {
		c.e.t.Fatal(err)
	}
	for k, vs := range c.header {
		req.Header[k] = slices.Clone(vs)
	}
	res, err := c.e.ts.Client().Do(req)
	if err != nil {
		c.e.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		c.e.t.Fatal(err)
	}
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

// jsonBody marshals v.
func jsonBody(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// want checks a response's status and exact body (its final newline aside), and that a
// body is declared as JSON.
func want(t *testing.T, r response, status int, body string) {
	t.Helper()
	got := strings.TrimSuffix(r.body, "\n")
	if r.status != status || got != body {
		t.Errorf("got %d %s\nwant %d %s", r.status, got, status, body)
	}
	if body != "" && r.header.Get("Content-Type") != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", r.header.Get("Content-Type"))
	}
}

// wantStatus checks only a response's status.
func wantStatus(t *testing.T, r response, status int) {
	t.Helper()
	if r.status != status {
		t.Errorf("got %d %s, want %d", r.status, r.body, status)
	}
}

// exec runs SQL on the test database.
func (e *testEnv) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
}

// scalar runs a one-value query on the test database.
func scalar[T any](e *testEnv, sql string, args ...any) T {
	e.t.Helper()
	var v T
	if err := e.pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		e.t.Fatalf("%s: %v", sql, err)
	}
	return v
}

// sortedKeys returns the member names of a JSON object, sorted and comma-separated.
func sortedKeys(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}

// fieldInt is a zap field as the observer records an Int field.
func fieldInt(key string, v int) zap.Field { return zap.Int(key, v) }

// fmtPrefixes formats prefixes as fmt formats a slice of them.
func fmtPrefixes(ps []netip.Prefix) string { return fmt.Sprint(ps) }
