package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/template"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/schema/schematest"
)

// gatewaySecret is what the gateways send and the upstream expects in these tests.
const gatewaySecret = "integration-gateway-secret-0123456789"

var (
	buildOnce sync.Once
	buildErr  error
	binDir    string
)

// root is the repository's top folder.
func root(t testing.TB) string {
	t.Helper()
	dir, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// binaries runs `make build` once per test run (incremental: it rebuilds bin/upstream
// and bin/caddy only when their sources changed) and returns the folder holding them.
// KEYGATE_BIN names a folder of prebuilt binaries instead.
func binaries(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		if d := os.Getenv("KEYGATE_BIN"); d != "" {
			binDir = d
			return
		}
		top := root(t)
		binDir = filepath.Join(top, "bin")
		cmd := exec.Command("make", "-s", "build")
		cmd.Dir = top
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("make build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binDir
}

// freePort returns a loopback port nobody listens on right now.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitListening waits until something accepts connections on addr.
func waitListening(t testing.TB, addr string, p *proc) {
	t.Helper()
	testenv.Eventually(t, 30*time.Second, "something listening on "+addr, func() bool {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return true
		}
		if p != nil && p.exited() {
			t.Fatalf("%s exited before listening on %s:\n%s", p.name, addr, p.logs())
		}
		return false
	})
}

// proc is a child process whose output is kept for inspection.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *testenv.Buffer
	done chan struct{}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) logs() string { return p.out.String() }

// stop ends p: SIGTERM, then SIGKILL after five seconds.
func (p *proc) stop() {
	if p.exited() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}

// Stack is one test's world: a fresh database on the shared PostgreSQL, the shared
// Redis, one upstream and two gateways, all separate processes on loopback.
type Stack struct {
	t          *testing.T
	bin        string
	dbURL      string
	redisURL   string
	stackDir   string
	upstream   *proc
	upAddr     string
	gateways   []*gateway
	procs      []*proc // every process ever started, for the log checks
	mu         sync.Mutex
	secrets    []string // strings that must never appear in any log
	cliEnv     []string
	keyPrefix  string
	redisMode  string // redis_mode of the gateways
	redisTLSCA string // redis_tls_ca of the gateways started from now on
	gwOptions  string // more v1_gateway option lines for the gateways started from now on
	// globalOptions are more lines of the global options block of the gateways started
	// from now on (e.g. servers { trusted_proxies … }).
	globalOptions string
	// identityKey, if set, is the identity_key of the gateways, which then send no
	// gateway_secret; the upstream has no GATEWAY_SECRET and verifies with
	// --gateway-jwks against the JWKS of gateway 0, at jwksAddr.
	identityKey string
	jwksAddr    string
	// upstreamArgs are more flags of the upstream's serve.
	upstreamArgs []string
	// siteOptions are more lines of the gateways' site block (e.g. tracing), and
	// gatewayEnv and upstreamEnv more environment of the gateways and the upstream.
	siteOptions             string
	gatewayEnv, upstreamEnv []string
}

type gateway struct {
	proc    *proc
	addr    string
	mode    string
	config  string
	adminAt string
}

// URL returns the base URL of gateway i.
func (s *Stack) URL(i int) string { return "http://" + s.gateways[i].addr }

// newStack starts the processes. Gateway 0 runs limiter_failure open, gateway 1 closed;
// both share the Redis.
func newStack(t *testing.T) *Stack {
	t.Helper()
	return newStackWith(t, stackOptions{})
}

// newStackOn is newStack with the gateways' redis_url and redis_mode given.
func newStackOn(t *testing.T, redisURL, redisMode string) *Stack {
	t.Helper()
	return newStackWith(t, stackOptions{redisURL: redisURL, redisMode: redisMode})
}

// stackOptions change the world newStackWith starts; each empty field is newStack's.
type stackOptions struct {
	redisURL   string // the gateways' redis_url (REDIS_URL)
	redisMode  string // their redis_mode (single)
	redisTLSCA string // their redis_tls_ca (none)
	// databaseVia maps the URL of the test's fresh database to the one the upstream,
	// the gateways and the operator CLI use (e.g. the same database through
	// PgBouncer). The migrations always run on the direct URL.
	databaseVia func(direct string) string
	// identityKey is a PEM file of an Ed25519 key: the gateways sign the caller's
	// identity with it instead of sending the shared secret (Stack.identityKey).
	identityKey string
	// gwOptions and globalOptions are the gateways' Stack.gwOptions and
	// Stack.globalOptions (none).
	gwOptions, globalOptions string
	// upstreamArgs are more flags of `upstream serve` (none).
	upstreamArgs []string
	// siteOptions, gatewayEnv and upstreamEnv are the Stack's (none).
	siteOptions             string
	gatewayEnv, upstreamEnv []string
}

// newStackWith is newStack with options.
func newStackWith(t *testing.T, o stackOptions) *Stack {
	t.Helper()
	if o.redisURL == "" {
		o.redisURL = os.Getenv("REDIS_URL")
	}
	if o.redisMode == "" {
		o.redisMode = "single"
	}
	s := &Stack{
		t:          t,
		bin:        binaries(t),
		dbURL:      schematest.NewDatabase(t),
		redisURL:   o.redisURL,
		redisMode:  o.redisMode,
		redisTLSCA: o.redisTLSCA,
		stackDir:   os.Getenv("STACK_DIR"),
		keyPrefix:  "mon",
		secrets:    []string{gatewaySecret},
	}
	s.gwOptions, s.globalOptions = o.gwOptions, o.globalOptions
	s.upstreamArgs = o.upstreamArgs
	s.siteOptions, s.gatewayEnv, s.upstreamEnv = o.siteOptions, o.gatewayEnv, o.upstreamEnv
	if o.databaseVia != nil {
		s.dbURL = o.databaseVia(s.dbURL)
	}
	secretEnv := "GATEWAY_SECRET=" + gatewaySecret
	if o.identityKey != "" {
		s.identityKey = o.identityKey
		s.jwksAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		secretEnv = "GATEWAY_SECRET="
	}
	if s.redisURL == "" {
		t.Fatal("the Redis URL is not set: run the tests with `make test`")
	}
	s.cliEnv = append(os.Environ(), "DATABASE_URL="+s.dbURL, secretEnv)
	s.upAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s.startUpstream()
	for _, mode := range []string{"open", "closed"} {
		s.startGateway(mode)
	}
	t.Cleanup(func() {
		for _, g := range s.gateways {
			g.proc.stop()
		}
		s.upstream.stop()
		s.checkLogs()
		if t.Failed() {
			for _, p := range s.procs {
				t.Logf("--- log of %s ---\n%s", p.name, tail(p.logs(), 4000))
			}
		}
	})
	return s
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return s
}

func (s *Stack) start(name string, env []string, args ...string) *proc {
	s.t.Helper()
	p := &proc{name: name, out: &testenv.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command(args[0], args[1:]...)
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	if err := p.cmd.Start(); err != nil {
		s.t.Fatalf("starting %s: %v", name, err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	s.procs = append(s.procs, p)
	return p
}

// startUpstream starts (or restarts) the upstream on its address.
func (s *Stack) startUpstream() {
	s.t.Helper()
	args := []string{filepath.Join(s.bin, "upstream"), "serve", "--addr", s.upAddr}
	if s.jwksAddr != "" {
		args = append(args, "--gateway-jwks", "http://"+s.jwksAddr+"/.well-known/jwks.json")
	}
	args = append(args, s.upstreamArgs...)
	s.upstream = s.start("upstream", append(slices.Clip(s.cliEnv), s.upstreamEnv...), args...)
	waitListening(s.t, s.upAddr, s.upstream)
}

// stopUpstream stops the upstream; startUpstream brings it back on the same address.
func (s *Stack) stopUpstream() { s.upstream.stop() }

var caddyfileTmpl = template.Must(template.New("caddyfile").Parse(`{
	admin {{.Admin}}
	auto_https off
	persist_config off
	order v1_gateway before reverse_proxy
	{{.Global}}
	# The logging of Caddyfile.example.
	log {
		format filter {
			wrap json
			fields {
				request>uri keygate_redact
				request>host keygate_redact
				request>method keygate_redact
				request>tls>server_name keygate_redact
				request>headers keygate_redact
				resp_headers keygate_redact
			}
		}
	}
}

http://{{.Addr}} {
	bind 127.0.0.1
	log
	{{.Site}}
	handle /v1/* {
		v1_gateway {
			database_url   {env.DATABASE_URL}
			redis_url      {env.REDIS_URL}
			redis_mode     {{.RedisMode}}
			{{with .RedisTLSCA}}redis_tls_ca {{.}}{{end}}
			key_prefix     {{.Prefix}}
			{{if .IdentityKey}}identity_key {{.IdentityKey}}{{else}}gateway_secret {env.GATEWAY_SECRET}{{end}}
			limiter_failure {{.Mode}}
			{{.Extra}}
		}
		reverse_proxy {{.Upstream}}
	}
	handle /healthz {
		keygate_health
	}
	{{with .IdentityKey}}handle /.well-known/jwks.json {
		v1_gateway_jwks {{.}}
	}{{end}}
	handle {
		reverse_proxy {{.Upstream}} {
			header_up X-Forwarded-For {client_ip}
		}
	}
}
`))

// caddyfile is the Caddyfile of gateway g, with extra as its v1_gateway's more lines.
func (s *Stack) caddyfile(g *gateway, extra string) []byte {
	var cfg bytes.Buffer
	caddyfileTmpl.Execute(&cfg, map[string]any{
		"Admin": g.adminAt, "Addr": g.addr, "Prefix": s.keyPrefix, "Mode": g.mode, "Upstream": s.upAddr,
		"RedisMode": s.redisMode, "RedisTLSCA": s.redisTLSCA, "Extra": extra, "IdentityKey": s.identityKey,
		"Global": s.globalOptions, "Site": s.siteOptions,
	})
	return cfg.Bytes()
}

// startGateway starts one more Caddy with the module.
func (s *Stack) startGateway(mode string) *gateway {
	s.t.Helper()
	g := &gateway{
		addr:    s.jwksAddr,
		adminAt: fmt.Sprintf("127.0.0.1:%d", freePort(s.t)),
		mode:    mode,
	}
	if len(s.gateways) > 0 || g.addr == "" {
		g.addr = fmt.Sprintf("127.0.0.1:%d", freePort(s.t))
	}
	dir := s.t.TempDir()
	g.config = filepath.Join(dir, "Caddyfile")
	if err := os.WriteFile(g.config, s.caddyfile(g, s.gwOptions), 0o600); err != nil {
		s.t.Fatal(err)
	}
	env := append(os.Environ(), "DATABASE_URL="+s.dbURL, "REDIS_URL="+s.redisURL,
		"GATEWAY_SECRET="+gatewaySecret, "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	env = append(env, s.gatewayEnv...)
	g.proc = s.start(fmt.Sprintf("gateway %d (%s)", len(s.gateways), mode), env,
		filepath.Join(s.bin, "caddy"), "run", "--config", g.config, "--adapter", "caddyfile")
	waitListening(s.t, g.addr, g.proc)
	s.gateways = append(s.gateways, g)
	return g
}

// cli runs bin/upstream with args against this stack's database and decodes the one
// JSON object it prints.
func (s *Stack) cli(stdin string, args ...string) map[string]any {
	s.t.Helper()
	out, err := s.cliRaw(stdin, args...)
	if err != nil {
		s.t.Fatalf("upstream %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	var v map[string]any
	if err := json.Unmarshal(out, &v); err != nil {
		s.t.Fatalf("upstream %s printed %q, not one JSON object: %v", strings.Join(args, " "), out, err)
	}
	return v
}

func (s *Stack) cliRaw(stdin string, args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(s.bin, "upstream"), args...)
	cmd.Env = s.cliEnv
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return append(stdout.Bytes(), stderr.Bytes()...), err
	}
	return stdout.Bytes(), nil
}

// stackCmd runs scripts/stack.sh's fault commands on the shared servers.
func (s *Stack) stackCmd(command string) {
	s.t.Helper()
	if s.stackDir == "" {
		s.t.Fatal("STACK_DIR is not set: fault tests stop and restart the servers of scripts/stack.sh; run `make test`")
	}
	cmd := exec.Command(filepath.Join(root(s.t), "scripts", "stack.sh"), command, s.stackDir)
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("stack.sh %s: %v\n%s", command, err, out)
	}
}

// neverLog registers a string (a key, a secret, a session token) that must not appear
// in any process's output; checked when the test ends.
func (s *Stack) neverLog(secret string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.secrets = append(s.secrets, secret)
}

func (s *Stack) checkLogs() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		logs := p.logs()
		for _, secret := range s.secrets {
			if strings.Contains(logs, secret) {
				s.t.Errorf("the log of %s contains a secret %.12s…", p.name, secret)
			}
		}
	}
}

// Org is an organisation set up through the operator CLI, with an Owner who can log in.
type Org struct {
	ID       string
	Email    string
	Password string
}

var orgSeq int
var orgMu sync.Mutex

// newOrg creates an org on plan with an Owner, through the operator CLI.
func (s *Stack) newOrg(plan string) Org {
	s.t.Helper()
	orgMu.Lock()
	orgSeq++
	n := orgSeq
	orgMu.Unlock()
	o := Org{Email: fmt.Sprintf("owner%d-%d@example.com", n, time.Now().UnixNano()), Password: fmt.Sprintf("pw-%d-correct horse", n)}
	o.ID = s.cli("", "org", "create", "--name", fmt.Sprintf("org %d", n), "--plan", plan)["id"].(string)
	s.cli(o.Password+"\n", "user", "create", "--email", o.Email, "--password-stdin")
	s.cli("", "member", "add", "--org", o.ID, "--email", o.Email, "--role", "Owner")
	s.neverLog(o.Password)
	return o
}

// Client is an HTTP client of gateway 0 with a cookie jar (a person at the dashboard).
type Client struct {
	s    *Stack
	http *http.Client
	base string
}

// login logs in through the gateway's dashboard route and returns a client carrying
// the session cookie.
func (s *Stack) login(email, password string) *Client {
	s.t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &Client{s: s, http: &http.Client{Jar: jar, Timeout: 30 * time.Second}, base: s.URL(0)}
	resp := c.do("POST", "/auth/login", map[string]string{"email": email, "password": password}, nil)
	if resp.Status != http.StatusNoContent {
		s.t.Fatalf("login as %s: %d %s", email, resp.Status, resp.Body)
	}
	for _, ck := range resp.Header.Values("Set-Cookie") {
		if v, ok := strings.CutPrefix(ck, "session="); ok {
			token, _, _ := strings.Cut(v, ";")
			s.neverLog(token)
		}
	}
	return c
}

func (s *Stack) loginOwner(o Org) *Client { return s.login(o.Email, o.Password) }

// newOwner creates an org on plan and returns it with its Owner logged in at the
// dashboard, through which a test creates the org's keys and monitors.
func (s *Stack) newOwner(plan string) (Org, *Client) {
	s.t.Helper()
	org := s.newOrg(plan)
	return org, s.loginOwner(org)
}

// newKey creates an org on plan and, through its owner's dashboard, a key named k of
// role: all that a test of /v1 alone needs before it starts.
func (s *Stack) newKey(plan, role string) (Org, string) {
	org, owner := s.newOwner(plan)
	_, key := owner.createKey(org.ID, "k", role, nil)
	return org, key
}

// Resp is a whole response.
type Resp struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a map, failing the test if it is not a JSON object.
func (r Resp) JSON(t testing.TB) map[string]any {
	t.Helper()
	var v map[string]any
	if err := json.Unmarshal(r.Body, &v); err != nil {
		t.Fatalf("body %q is not a JSON object: %v", r.Body, err)
	}
	return v
}

func (c *Client) do(method, path string, body any, header http.Header) Resp {
	c.s.t.Helper()
	return doRequest(c.s.t, c.http, method, c.base+path, body, header)
}

func doRequest(t testing.TB, hc *http.Client, method, url string, body any, header http.Header) Resp {
	t.Helper()
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	case []byte:
		raw = b
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		raw = j
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(raw)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, vs := range header {
		req.Header.Del(k)
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	resp, b := testenv.Exchange(t, hc, req)
	checkExchange(t, req, raw, resp, b)
	return Resp{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// createKey creates an API key through the dashboard and returns its id and full key.
func (c *Client) createKey(orgID, name, role string, expiresAt *time.Time) (id, key string) {
	c.s.t.Helper()
	body := map[string]any{"name": name, "role": role}
	if expiresAt != nil {
		body["expires_at"] = expiresAt.UTC().Format(time.RFC3339)
	}
	r := c.do("POST", "/orgs/"+orgID+"/api-keys", body, nil)
	if r.Status != http.StatusCreated {
		c.s.t.Fatalf("creating a key: %d %s", r.Status, r.Body)
	}
	v := r.JSON(c.s.t)
	key, _ = v["key"].(string)
	id, _ = v["id"].(string)
	if key == "" || id == "" {
		c.s.t.Fatalf("create key answered %s", r.Body)
	}
	c.s.neverLog(key)
	if _, secret, ok := strings.Cut(key, "."); ok {
		c.s.neverLog(secret)
	}
	return id, key
}

// api is a /v1 client of one gateway with one key.
type api struct {
	s    *Stack
	key  string
	base string
	http *http.Client
}

var plainClient = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

func (s *Stack) api(key string, gatewayIdx int) *api {
	return &api{s: s, key: key, base: s.URL(gatewayIdx), http: plainClient}
}

func (a *api) do(method, path string, body any) Resp {
	a.s.t.Helper()
	h := http.Header{}
	if a.key != "" {
		h.Set("Authorization", "Bearer "+a.key)
	}
	return doRequest(a.s.t, a.http, method, a.base+path, body, h)
}

// call is a /v1 request: key, to gateway gw.
type call struct {
	key          string
	gw           int
	method, path string
	body         any
}

// step is a call and the status it must answer.
type step struct {
	call
	status int
}

// sendSteps sends steps in order, and fails the test at the first that answers another
// status than its own.
func (s *Stack) sendSteps(steps []step) {
	s.t.Helper()
	for i, st := range steps {
		if r := s.send(st.call); r.Status != st.status {
			s.t.Fatalf("step %d, %s %s on gateway %d: %d %s, want %d", i, st.method, st.path, st.gw, r.Status, r.Body, st.status)
		}
	}
}

// usageRecordRow is a row of the usage record as GET /orgs/{orgId}/usage answers it.
type usageRecordRow struct {
	KeyID   string `json:"key_id"`
	Outcome string `json:"outcome"`
	Status  int    `json:"status"`
	Count   int64  `json:"count"`
	Units   int64  `json:"units"`
}

// name is the row's "key_id outcome status", by which the usage tests compare rows.
func (u usageRecordRow) name() string { return fmt.Sprintf("%s %s %d", u.KeyID, u.Outcome, u.Status) }

// usage reads orgID's usage record through GET /orgs/{orgId}/usage with the query q.
func (c *Client) usage(orgID string, q url.Values) []usageRecordRow {
	c.s.t.Helper()
	r := c.do("GET", "/orgs/"+orgID+"/usage?"+q.Encode(), nil, nil)
	if r.Status != 200 {
		c.s.t.Fatalf("reading usage: %d %s", r.Status, r.Body)
	}
	var body struct {
		Data []usageRecordRow `json:"data"`
	}
	if err := json.Unmarshal(r.Body, &body); err != nil {
		c.s.t.Fatalf("usage body %s: %v", r.Body, err)
	}
	return body.Data
}

// raw sends a request to any URL with exactly the given headers (no Authorization added).
func (s *Stack) raw(method, url string, body any, header http.Header) Resp {
	s.t.Helper()
	return doRequest(s.t, plainClient, method, url, body, header)
}

// wantError asserts a JSON error response: status, Content-Type and the whole body.
func wantError(t testing.TB, r Resp, status int, body string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("status %d, want %d (body %s)", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	if !jsonEqual(r.Body, []byte(body)) {
		t.Errorf("body %s, want %s", r.Body, body)
	}
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xj, _ := json.Marshal(x)
	yj, _ := json.Marshal(y)
	return bytes.Equal(xj, yj)
}

// waitForWindowRoom sleeps into the next UTC minute when fewer than need seconds are
// left in the current one, so that a burst of requests falls in one rate limit window.
func waitForWindowRoom(need int) {
	now := time.Now()
	left := 60 - now.Unix()%60
	if left < int64(need) {
		// A minute's start in Redis's clock: no event marks it.
		time.Sleep(time.Duration(left)*time.Second - time.Duration(now.Nanosecond()) + 50*time.Millisecond)
	}
}
