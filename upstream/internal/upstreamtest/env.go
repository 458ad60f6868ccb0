// Package upstreamtest holds what the tests of the upstream's packages share. Only
// tests import it. It starts an httpapi.Server on a fresh database, behind an
// httptest.Server. It makes the fixtures the server needs: plans, organisations,
// users, members, sessions. It has a client for the server, and a clock that moves
// only when told.
package upstreamtest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
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
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/password"
	"github.com/keygate/keygate/upstream/store"
)

// GatewaySecret is the gateway secret of every test server.
const GatewaySecret = "test-gateway-secret-0123456789"

// Env is an httpapi.Server on a fresh database, behind an httptest.Server. Its methods
// create fixtures and make requests.
type Env struct {
	T     *testing.T
	Pool  *pgxpool.Pool // the fixtures' and queries' pool
	DBURL string
	// Config is what Server was built with.
	Config httpapi.Config
	Server *httpapi.Server
	// Store and Keys are on Pool; Keys has the Config's KeyFormat.
	Store *store.Store
	Keys  *keystore.Store
	TS    *httptest.Server
	Logs  *observer.ObservedLogs
	// Seq numbers the fixtures, so that their names and emails never collide.
	Seq atomic.Int64

	hasher *password.Hasher // hashes the fixtures' passwords
}

// NewEnv starts a Server on a fresh database; opts adjust its Config.
func NewEnv(t *testing.T, opts ...func(*httpapi.Config)) *Env {
	t.Helper()
	return NewEnvOn(t, schematest.NewDatabase(t), opts...)
}

// NewOrgEnv is NewEnv with an organisation on planName and a person of role in it. It
// returns the organisation's id and a client logged in as the person. Most route tests
// start there.
func NewOrgEnv(t *testing.T, planName, role string) (e *Env, orgID string, c *Client) {
	t.Helper()
	e = NewEnv(t)
	orgID = e.Org(planName)
	return e, orgID, e.Person(role, orgID)
}

// NewEnvOn starts a Server on the migrated database at dbURL.
func NewEnvOn(t *testing.T, dbURL string, opts ...func(*httpapi.Config)) *Env {
	t.Helper()
	pool := NewPool(t, dbURL, store.DefaultDatabaseTimeout)
	return NewEnvWith(t, pool, pool, dbURL, opts...)
}

// NewPool opens a pool on dbURL, configured as serve's (store.PoolConfig). The pool is
// closed when the test ends.
func NewPool(t *testing.T, dbURL string, timeout time.Duration) *pgxpool.Pool {
	t.Helper()
	cfg, err := store.PoolConfig(dbURL, 0, timeout)
	if err != nil {
		t.Fatal(err)
	}
	return schematest.OpenPool(t, cfg)
}

// NewEnvWith starts a Server on serverPool; the env's fixtures and queries use pool.
func NewEnvWith(t *testing.T, pool, serverPool *pgxpool.Pool, dbURL string, opts ...func(*httpapi.Config)) *Env {
	t.Helper()
	core, logs := observer.New(zap.DebugLevel)
	format, err := keystore.NewFormat("mon")
	if err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.Config{Pool: serverPool, Logger: zap.New(core), GatewaySecret: GatewaySecret, KeyFormat: format}
	for _, o := range opts {
		o(&cfg)
	}
	srv, err := httpapi.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	// No answer of the API is a redirect; a test must see one if it happens.
	ts.Client().CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &Env{T: t, Pool: pool, DBURL: dbURL, Config: cfg, Server: srv, Store: store.New(pool),
		Keys: keystore.New(pool, cfg.KeyFormat), TS: ts, Logs: logs, hasher: password.NewHasher()}
}

// Org creates an organisation on planName and returns its id.
func (e *Env) Org(planName string) string {
	e.T.Helper()
	o, err := e.Store.CreateOrg(context.Background(), fmt.Sprintf("org %d", e.Seq.Add(1)), planName)
	if err != nil {
		e.T.Fatalf("creating org: %v", err)
	}
	return o.ID
}

// Plan creates or replaces a plan. An OrgRateLimit, APIRequestsPerMonth or window of
// 0, which no plan has, is taken as -1 (none), so that a test names only the budgets
// it sets.
func (e *Env) Plan(p store.Plan) {
	e.T.Helper()
	for _, n := range []*int{&p.OrgRateLimit, &p.APIRateLimitPerSecond, &p.APIRateLimitPerHour, &p.APIRateLimitPerDay} {
		if *n == 0 {
			*n = -1
		}
	}
	if p.APIRequestsPerMonth == 0 {
		p.APIRequestsPerMonth = -1
	}
	if _, err := e.Store.PutPlan(context.Background(), p); err != nil {
		e.T.Fatalf("putting plan: %v", err)
	}
}

// SetPlan moves orgID to planName.
func (e *Env) SetPlan(orgID, planName string) {
	e.T.Helper()
	if _, err := e.Store.SetOrgPlan(context.Background(), orgID, planName); err != nil {
		e.T.Fatalf("setting plan: %v", err)
	}
}

// User creates a user with a fresh email and returns the email and password.
func (e *Env) User() (email, password string) {
	e.T.Helper()
	n := e.Seq.Add(1)
	email, password = fmt.Sprintf("user%d@example.com", n), fmt.Sprintf("password %d", n)
	if _, err := e.Store.CreateUser(context.Background(), e.hasher, email, password); err != nil {
		e.T.Fatalf("creating user: %v", err)
	}
	return email, password
}

// Member makes the user with email a member of orgID.
func (e *Env) Member(orgID, email, role string) {
	e.T.Helper()
	if _, err := e.Store.AddMember(context.Background(), orgID, email, role); err != nil {
		e.T.Fatalf("adding member: %v", err)
	}
}

// Account creates a user with role in each of orgIDs. It returns their email, their
// password, and a client logged in as them.
func (e *Env) Account(role string, orgIDs ...string) (email, password string, c *Client) {
	e.T.Helper()
	email, password = e.User()
	for _, o := range orgIDs {
		e.Member(o, email, role)
	}
	return email, password, e.Login(email, password)
}

// Person is Account for a test that needs only the client.
func (e *Env) Person(role string, orgIDs ...string) *Client {
	e.T.Helper()
	_, _, c := e.Account(role, orgIDs...)
	return c
}

// Login logs in and returns a client carrying the session cookie.
func (e *Env) Login(email, password string) *Client {
	e.T.Helper()
	anon := e.Anon()
	r := anon.Do("POST", "/auth/login", JSONBody(map[string]string{"email": email, "password": password}))
	if r.Status != http.StatusNoContent {
		e.T.Fatalf("login: %d %s", r.Status, r.Body)
	}
	for _, c := range r.Cookies() {
		if c.Name == httpapi.SessionCookie {
			return &Client{Env: e, Header: http.Header{"Cookie": {httpapi.SessionCookie + "=" + c.Value}}}
		}
	}
	e.T.Fatal("login set no session cookie")
	return nil
}

// Anon returns a client without credentials.
func (e *Env) Anon() *Client {
	return &Client{Env: e, Header: http.Header{}}
}

// Gateway returns a client with the headers the gateway adds for a key of role in
// orgID.
func (e *Env) Gateway(orgID, role string) *Client {
	return &Client{Env: e, Header: http.Header{
		httpapi.HeaderSecret:  {GatewaySecret},
		httpapi.HeaderOrgID:   {orgID},
		httpapi.HeaderKeyID:   {"AAAAAAAAAAAAAAAAAAAAAA"},
		httpapi.HeaderKeyRole: {role},
	}}
}

// Exec runs SQL on the test database.
func (e *Env) Exec(sql string, args ...any) {
	e.T.Helper()
	if _, err := e.Pool.Exec(context.Background(), sql, args...); err != nil {
		e.T.Fatalf("%s: %v", sql, err)
	}
}

// Scalar runs a one-value query on the test database.
func Scalar[T any](e *Env, sql string, args ...any) T {
	e.T.Helper()
	var v T
	if err := e.Pool.QueryRow(context.Background(), sql, args...).Scan(&v); err != nil {
		e.T.Fatalf("%s: %v", sql, err)
	}
	return v
}

// SortedKeys returns the member names of a JSON object, sorted and comma-separated.
func SortedKeys(m map[string]any) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return strings.Join(keys, ",")
}
