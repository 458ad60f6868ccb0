package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/schema/schematest"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

func TestParseTrustedProxies(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"", "[]", true},
		{defaultTrustedProxies, "[127.0.0.0/8 ::1/128]", true},
		{" 10.1.2.3 , 192.168.7.9/16,::ffff:10.0.0.1", "[10.1.2.3/32 192.168.0.0/16 10.0.0.1/32]", true},
		{"10.0.0.0/33", "", false},
		{"caddy", "", false},
	} {
		got, err := parseTrustedProxies(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseTrustedProxies(%q): err %v", tc.in, err)
			continue
		}
		if s := fmt.Sprint(got); tc.ok && s != tc.want {
			t.Errorf("parseTrustedProxies(%q) = %s, want %s", tc.in, s, tc.want)
		}
	}
}

// TestServeAdminAddrIsApartFromAddr runs `serve --admin-addr`: the admin endpoints
// answer there, and the public address knows none of them.
func TestServeAdminAddrIsApartFromAddr(t *testing.T) {
	dbURL := schematest.NewDatabase(t)
	env := map[string]string{"DATABASE_URL": dbURL, "GATEWAY_SECRET": upstreamtest.GatewaySecret}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, done := startServe(ctx, env, "serve", "--addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0")
	var addr, adminAddr string
	lines := bufio.NewScanner(pr)
	for addr == "" && lines.Scan() {
		var entry struct {
			Msg       string `json:"msg"`
			Addr      string `json:"addr"`
			AdminAddr string `json:"admin_addr"`
		}
		if err := json.Unmarshal(lines.Bytes(), &entry); err != nil {
			t.Fatalf("log line %q is not JSON", lines.Text())
		}
		switch entry.Msg {
		case "serving admin endpoints":
			adminAddr = entry.AdminAddr
		case "serving":
			addr = entry.Addr
		}
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // logging never blocks the server
	if addr == "" || adminAddr == "" {
		t.Fatalf("serve logged addr %q and admin_addr %q", addr, adminAddr)
	}

	wantStatusOf := func(url string, status int, contains string) {
		t.Helper()
		got, body := upstreamtest.Get(t, url)
		if got != status || !strings.Contains(body, contains) {
			t.Errorf("GET %s = %d %.200s, want %d with %q", url, got, body, status, contains)
		}
	}
	wantStatusOf("http://"+addr+"/auth/nope", http.StatusNotFound, `"error"`)
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		wantStatusOf("http://"+addr+path, http.StatusNotFound, `{"error":"not found"}`)
	}
	wantStatusOf("http://"+adminAddr+"/healthz", http.StatusOK, `{"status":"ok","version":"`+version.String()+`"}`)
	wantStatusOf("http://"+adminAddr+"/readyz", http.StatusOK, `{"status":"ready"}`)
	wantStatusOf("http://"+adminAddr+"/metrics", http.StatusOK, `keygate_upstream_http_requests_total{code="404",route="none"} 4`)

	cancel()
	wantExit(t, done, "")
}

func TestLogsCarryNoSecrets(t *testing.T) {
	var logs testenv.Buffer
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.Logger = newLogger(&logs) })
	org := e.Org("pro")
	email, password, owner := e.Account(store.RoleOwner, org)
	token := strings.TrimPrefix(owner.Header.Get("Cookie"), "session=")

	var key struct{ ID, Key string }
	owner.Do("POST", "/orgs/"+org+"/api-keys", `{"name":"ci","role":"Admin"}`).Decode(t, &key)
	gw := e.Gateway(org, store.RoleAdmin)
	upstreamtest.WantStatus(t, gw.Do("POST", "/v1/monitors", `{"name":"n","type":"http","target":"https://example.com","config":{"token":"CONFIG-SECRET"}}`), 201)
	upstreamtest.WantStatus(t, e.Anon().With(httpapi.HeaderSecret, "WRONG-SECRET").Do("GET", "/v1/monitors", ""), 401)
	upstreamtest.WantStatus(t, e.Anon().Do("POST", "/auth/login", `{"email":"`+email+`","password":"WRONG-PASSWORD"}`), 401)
	upstreamtest.WantStatus(t, owner.Do("POST", "/auth/logout", ""), 204)

	out := logs.String()
	if !strings.Contains(out, `"msg":"request"`) || !strings.Contains(out, `"path":"/auth/login"`) {
		t.Fatalf("no request log:\n%s", out)
	}
	for _, secret := range []string{password, "WRONG-PASSWORD", token, upstreamtest.GatewaySecret, "WRONG-SECRET", key.Key,
		key.Key[strings.IndexByte(key.Key, '.')+1:], "CONFIG-SECRET", "session="} {
		if strings.Contains(out, secret) {
			t.Errorf("logs contain %q:\n%s", secret, out)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Errorf("log line %q is not JSON", line)
		}
	}
}

// TestServeChecksTheUsageExportAtStart runs serve with a usage export it must refuse:
// it exits 2 naming the flag, before it connects to anything.
func TestServeChecksTheUsageExportAtStart(t *testing.T) {
	env := map[string]string{"DATABASE_URL": "postgres://nobody@127.0.0.1:1/none", "GATEWAY_SECRET": upstreamtest.GatewaySecret}
	const open = "--webhook-allow-http"
	// The refusal's own words, and what follows them, are package webhook's
	// (CheckURL); serve names the flag.
	const refusedAddress = "--usage-export-url: must not resolve to a loopback, private, link-local"
	for _, tc := range []struct {
		name   string
		args   []string
		stderr string
	}{
		{"a loopback receiver", []string{open, "--usage-export-url", "http://127.0.0.1:9/events"},
			refusedAddress},
		{"a private receiver", []string{"--usage-export-url", "https://10.1.2.3/api/v1/events"},
			refusedAddress},
		{"a name of loopback", []string{"--usage-export-url", "https://localhost/api/v1/events"},
			refusedAddress},
		{"plain http", []string{"--usage-export-url", "http://openmeter.example.com/api/v1/events"},
			"--usage-export-url: must be https"},
		{"not a URL", []string{"--usage-export-url", "openmeter:8888"},
			"--usage-export-url: must be an absolute URL"},
		{"a secret without its prefix", []string{"--webhook-allow-private", "--usage-export-url", "https://127.0.0.1/e", "--usage-export-secret", "c2VjcmV0"},
			"--usage-export-secret must be whsec_ and the base64 of at least 24 bytes"},
		{"a short secret", []string{"--webhook-allow-private", "--usage-export-url", "https://127.0.0.1/e", "--usage-export-secret", "whsec_c2VjcmV0"},
			"--usage-export-secret must be whsec_ and the base64 of at least 24 bytes"},
		{"a batch of none", []string{"--usage-export-batch-size", "0"}, "--usage-export-batch-size must be from 1 to 1000"},
		{"a batch too large", []string{"--usage-export-batch-size", "1001"}, "--usage-export-batch-size must be from 1 to 1000"},
		{"a negative delay", []string{"--usage-export-delay", "-1s"}, "--usage-export-delay must not be negative"},
		{"no interval", []string{"--usage-export-interval", "0s"}, "--usage-export-interval must be positive"},
		{"no timeout", []string{"--usage-export-timeout", "0s"}, "--usage-export-timeout must be positive"},
		{"no backoff", []string{"--usage-export-backoff", "0s"}, "--usage-export-backoff must be positive"},
		{"a backoff longer than its most", []string{"--usage-export-backoff", "2m", "--usage-export-backoff-max", "1m"},
			"--usage-export-backoff-max must be at least --usage-export-backoff"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := run(t, env, "", append([]string{"serve"}, tc.args...)...)
			if want := "upstream serve: usage: " + tc.stderr; code != 2 || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, stderr %q; want 2, %q", code, stderr, want)
			}
		})
	}
}
