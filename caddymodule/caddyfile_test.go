package caddymodule

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
	"github.com/keygate/keygate/internal/testkit/testenv"
)

var updateAdapt = flag.Bool("update-adapt", false, "rewrite the expected JSON of testdata/caddyfile_adapt")

func TestUnmarshalCaddyfile(t *testing.T) {
	for _, tc := range []struct {
		name  string
		input string
		want  Handler
	}{
		{
			name: "every option",
			input: `v1_gateway {
				database_url     {env.DATABASE_URL}
				redis_url        rediss://127.0.0.1:6379/0?addr=127.0.0.1:6380
				redis_mode       cluster
				redis_tls_ca     /etc/keygate/redis-ca.pem
				key_prefix       acme
				gateway_secret   {env.GATEWAY_SECRET}
				identity_key     /etc/keygate/identity.pem
				identity_audience billing
				strip_fields     config assertions
				limiter_failure  closed
				database_timeout 1500ms
				redis_timeout    150ms
				database_dial_timeout 3s
				redis_dial_timeout    4s
				database_min_conns    6
				redis_min_conns       12
				lookup_lanes     3
				batch_linger     2ms
				disable_lookup_batching
				disable_count_pipelining
				legacy_keys      reject
				last_used_interval 30s
				usage_flush_interval 5s
				usage_buffer     5000
				usage            off
				max_request_body 2MiB
			}`,
			want: Handler{
				LegacyKeys:             "reject",
				LastUsedInterval:       caddy.Duration(30 * time.Second),
				UsageFlushInterval:     caddy.Duration(5 * time.Second),
				UsageBuffer:            5000,
				DisableUsage:           true,
				MaxRequestBody:         2 << 20,
				DatabaseURL:            "{env.DATABASE_URL}",
				RedisURL:               "rediss://127.0.0.1:6379/0?addr=127.0.0.1:6380",
				RedisMode:              "cluster",
				RedisTLSCA:             "/etc/keygate/redis-ca.pem",
				KeyPrefix:              "acme",
				GatewaySecret:          "{env.GATEWAY_SECRET}",
				IdentityKey:            "/etc/keygate/identity.pem",
				IdentityAudience:       "billing",
				StripFields:            []string{"config", "assertions"},
				LimiterFailure:         "closed",
				DatabaseTimeout:        caddy.Duration(1500 * time.Millisecond),
				RedisTimeout:           caddy.Duration(150 * time.Millisecond),
				DatabaseDialTimeout:    caddy.Duration(3 * time.Second),
				RedisDialTimeout:       caddy.Duration(4 * time.Second),
				DatabaseMinConns:       6,
				RedisMinConns:          12,
				LookupLanes:            3,
				BatchLinger:            caddy.Duration(2 * time.Millisecond),
				DisableLookupBatching:  true,
				DisableCountPipelining: true,
			},
		},
		{
			name: "required options only",
			input: `v1_gateway {
				database_url postgres://db/keys
				gateway_secret s
			}`,
			want: Handler{DatabaseURL: "postgres://db/keys", GatewaySecret: "s"},
		},
		{
			name: "strip_fields on several lines add up",
			input: `v1_gateway {
				strip_fields config
				strip_fields assertions org_id
			}`,
			want: Handler{StripFields: []string{"config", "assertions", "org_id"}},
		},
		{
			name:  "empty block",
			input: "v1_gateway {\n}",
			want:  Handler{},
		},
		{
			name: "durations in days",
			input: `v1_gateway {
				database_timeout 1d
			}`,
			want: Handler{DatabaseTimeout: caddy.Duration(24 * time.Hour)},
		},
		{
			name: "last_used_interval off",
			input: `v1_gateway {
				last_used_interval off
				legacy_keys accept
			}`,
			want: Handler{LastUsedInterval: -1, LegacyKeys: "accept"},
		},
		{
			name: "last_used_interval at its minimum",
			input: `v1_gateway {
				last_used_interval 1s
			}`,
			want: Handler{LastUsedInterval: caddy.Duration(time.Second)},
		},
		{
			name: "usage on, as by default",
			input: `v1_gateway {
				usage on
				usage_flush_interval 1s
			}`,
			want: Handler{UsageFlushInterval: caddy.Duration(time.Second)},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got Handler
			if err := got.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input)); err != nil {
				t.Fatalf("UnmarshalCaddyfile: %v", err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func TestUnmarshalCaddyfileErrorsPointAtTheLine(t *testing.T) {
	type errorCase struct {
		name, input, want string
		line              int
	}
	cases := []errorCase{
		{"unknown subdirective", "v1_gateway {\n\tdatabase_url x\n\tdatabse_url y\n}", "unrecognized subdirective databse_url", 3},
		{"missing argument", "v1_gateway {\n\tdatabase_url\n}", "wrong argument count", 2},
		{"extra argument", "v1_gateway {\n\tkey_prefix mon acme\n}", "wrong argument count", 2},
		{"unknown limiter_failure", "v1_gateway {\n\tlimiter_failure maybe\n}", `limiter_failure must be open, closed or local, not "maybe"`, 2},
		{"bad duration", "v1_gateway {\n\n\tdatabase_timeout soon\n}", "parsing database_timeout", 3},
		{"strip_fields without names", "v1_gateway {\n\tstrip_fields\n}", "wrong argument count", 2},
		{"arguments on the directive", "v1_gateway postgres://x {\n}", "wrong argument count", 1},
		{"a switch with an argument", "v1_gateway {\n\tdisable_lookup_batching yes\n}", "wrong argument count", 2},
		{"unknown redis_mode", "v1_gateway {\n\tredis_mode ring\n}", `redis_mode must be single, cluster or sentinel, not "ring"`, 2},
		{"sentinel without master_name, mode first", "v1_gateway {\n\tredis_mode sentinel\n\tredis_url redis://127.0.0.1:26379\n}", "redis_mode sentinel needs ?master_name=<name>", 3},
		{"sentinel without master_name, url first", "v1_gateway {\n\tredis_url redis://127.0.0.1:26379\n\tredis_mode sentinel\n}", "redis_mode sentinel needs ?master_name=<name>", 3},
		{"unknown legacy_keys", "v1_gateway {\n\tlegacy_keys maybe\n}", `legacy_keys must be accept or reject, not "maybe"`, 2},
		{"last_used_interval too short", "v1_gateway {\n\tlast_used_interval 500ms\n}", "last_used_interval must be at least 1s, or off", 2},
		{"last_used_interval zero", "v1_gateway {\n\tlast_used_interval 0\n}", "last_used_interval must be at least 1s, or off", 2},
		{"last_used_interval not a duration", "v1_gateway {\n\tlast_used_interval never\n}", "parsing last_used_interval", 2},
		{"usage neither on nor off", "v1_gateway {\n\tusage maybe\n}", `usage must be on or off, not "maybe"`, 2},
		{"usage without argument", "v1_gateway {\n\tusage\n}", "wrong argument count", 2},
		{"usage_flush_interval too short", "v1_gateway {\n\tusage_flush_interval 500ms\n}", "usage_flush_interval must be at least 1s", 2},
		{"usage_flush_interval off", "v1_gateway {\n\tusage_flush_interval off\n}", "parsing usage_flush_interval", 2},
		{"duplicate switch", "v1_gateway {\n\tdisable_count_pipelining\n\tdisable_count_pipelining\n}", "disable_count_pipelining already specified", 3},
		{"route without a path", "v1_gateway {\n\troute GET\n}", "wrong argument count", 2},
		{"route with a dangling word", "v1_gateway {\n\troute GET /v1/x scope\n}", "wrong argument count", 2},
		{"route with an unknown method", "v1_gateway {\n\troute GET,FETCH /v1/x\n}", `unknown method "FETCH"`, 2},
		{"route with a bad scope", "v1_gateway {\n\troute GET /v1/x scope Reports\n}", `scope "Reports" must match`, 2},
		{"route with a zero cost", "v1_gateway {\n\troute GET /v1/x cost 0\n}", `cost must be a whole number from 1 to 1000000, not "0"`, 2},
		{"route with a cost over a million", "v1_gateway {\n\troute GET /v1/x cost 100000000000000000\n}", `cost 100000000000000000 must be from 1 to 1000000`, 2},
		{"route with a scope too long", "v1_gateway {\n\troute GET /v1/x scope r" + strings.Repeat("x", 64) + "\n}", `at most 64 characters`, 2},
		{"route with two costs", "v1_gateway {\n\troute GET /v1/x cost 2 cost 3\n}", "cost already specified", 2},
		{"route with an unknown word", "v1_gateway {\n\troute GET /v1/x weight 3\n}", `unrecognized "weight" (scope or cost)`, 2},
	}
	// An option given twice, with two valid values, is refused at its second line.
	for _, dup := range []string{
		"gateway_secret a b", "database_url a b", "redis_timeout 1s 2s", "redis_dial_timeout 1s 2s",
		"batch_linger 1ms 2ms", "lookup_lanes 1 2", "redis_mode cluster single", "redis_tls_ca a.pem b.pem",
		"legacy_keys accept reject", "last_used_interval off 1m", "usage off on", "usage on on",
		"usage_flush_interval 5s 10s", "usage_buffer 10 20", "max_request_body 1MiB 2MiB",
	} {
		f := strings.Fields(dup)
		cases = append(cases, errorCase{"duplicate " + f[0],
			"v1_gateway {\n\t" + f[0] + " " + f[1] + "\n\t" + f[0] + " " + f[2] + "\n}", f[0] + " already specified", 3})
	}
	// A count must be a whole number above zero, and the message quotes what it got.
	for _, bad := range []string{"lookup_lanes many", "lookup_lanes 0", "redis_min_conns 0", "database_min_conns few", "usage_buffer 0", "usage_buffer -5"} {
		opt, arg, _ := strings.Cut(bad, " ")
		cases = append(cases, errorCase{bad, "v1_gateway {\n\t" + bad + "\n}",
			opt + " must be a positive whole number, not " + strconv.Quote(arg), 2})
	}
	// A size must be above zero and in a unit go-humanize reads.
	for _, bad := range []string{"max_request_body 0", "max_request_body -1", "max_request_body lots", "max_request_body 1MiBs"} {
		opt, arg, _ := strings.Cut(bad, " ")
		cases = append(cases, errorCase{bad, "v1_gateway {\n\t" + bad + "\n}",
			opt + " must be a positive size such as 1MiB, not " + strconv.Quote(arg), 2})
	}
	// A timeout or a linger of zero would make every wait fail at once.
	for _, zero := range []string{"redis_timeout 0s", "database_dial_timeout 0s", "batch_linger 0"} {
		opt, _, _ := strings.Cut(zero, " ")
		cases = append(cases, errorCase{zero, "v1_gateway {\n\t" + zero + "\n}", opt + " must be positive", 2})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var h Handler
			err := h.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
			at := ", at Testfile:" + strconv.Itoa(tc.line)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasSuffix(err.Error(), at) {
				t.Errorf("error %v, want %q…%s", err, tc.want, at)
			}
		})
	}
}

// TestCaddyfileAdapt adapts every testdata/caddyfile_adapt/*.caddyfiletest. They are
// in the format of Caddy's own adapt tests: a Caddyfile, a line of ten dashes, then
// the JSON it adapts to, or the text of the error it must fail with.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob("testdata/caddyfile_adapt/*.caddyfiletest")
	if err != nil || len(files) == 0 {
		t.Fatalf("no adapt tests: %v", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, expected, ok := strings.Cut(string(data), "----------")
			if !ok {
				t.Fatal("no ---------- line")
			}
			input, expected = strings.TrimSpace(input)+"\n", strings.TrimSpace(expected)
			if expected == "" || expected[0] != '{' {
				_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
				if err == nil || !strings.Contains(err.Error(), expected) {
					t.Errorf("adapt error %v, want %q", err, expected)
				}
				return
			}
			if *updateAdapt {
				out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
				if err != nil {
					t.Fatal(err)
				}
				var pretty bytes.Buffer
				if err := json.Indent(&pretty, out, "", "\t"); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(input+"----------\n"+pretty.String()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			caddytest.AssertAdapt(t, input, "caddyfile", expected)
		})
	}
}

// TestExampleCaddyfileTracing turns on the tracing block Caddyfile.example shows,
// commented out: it adapts, without warnings, into Caddy's tracing handler.
func TestExampleCaddyfileTracing(t *testing.T) {
	input, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	on := strings.Replace(string(input), "\t# tracing {\n\t# \tspan keygate\n\t# }\n", "\ttracing {\n\t\tspan keygate\n\t}\n", 1)
	if on == string(input) {
		t.Fatal("Caddyfile.example no longer shows the commented tracing block")
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(on), nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile.example with tracing: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("warning: line %d: %s: %s", w.Line, w.Directive, w.Message)
	}
	if !strings.Contains(string(out), `{"handler":"tracing","span":"keygate"}`) {
		t.Errorf("no tracing handler in %s", out)
	}
}

// TestExampleCaddyfileTLS adapts Caddyfile.example as docs/operations.md's TLS says:
// a public name is Caddy's automatic HTTPS on :443; a test name with the commented
// `tls internal` is the local CA's certificate on its own port. Both keep the admin
// API on its unix socket.
func TestExampleCaddyfileTLS(t *testing.T) {
	input, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CADDY_ADMIN_SOCKET", "/run/keygate/caddy-admin.sock") // the default, whatever this shell has
	internal := strings.Replace(string(input), "\t# tls internal\n", "\ttls internal\n", 1)
	if internal == string(input) {
		t.Fatal("Caddyfile.example no longer shows the commented `tls internal`")
	}
	for _, tc := range []struct {
		addr, input string
		want, not   []string
	}{
		{"api.example.com", string(input), []string{`"listen":[":443"]`, `"host":["api.example.com"]`}, []string{`"module":"internal"`}},
		{"gateway.test:8443", internal, []string{`"listen":[":8443"]`, `"host":["gateway.test"]`,
			`"policies":[{"subjects":["gateway.test"],"issuers":[{"module":"internal"}]}]`}, nil},
	} {
		t.Setenv("GATEWAY_ADDR", tc.addr)
		out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tc.input), nil)
		if err != nil {
			t.Fatalf("adapting Caddyfile.example at %s: %v", tc.addr, err)
		}
		for _, w := range warnings {
			t.Errorf("%s: warning: line %d: %s: %s", tc.addr, w.Line, w.Directive, w.Message)
		}
		for _, want := range append(tc.want, `"admin":{"listen":"unix//run/keygate/caddy-admin.sock"`) {
			if !strings.Contains(string(out), want) {
				t.Errorf("%s: the JSON lacks %s:\n%s", tc.addr, want, out)
			}
		}
		for _, not := range tc.not {
			if strings.Contains(string(out), not) {
				t.Errorf("%s: the JSON has %s", tc.addr, not)
			}
		}
	}
}

// TestExampleCaddyfile checks that Caddyfile.example adapts, and that its JSON holds
// the gateway as docs/configuration.md shows it. It checks that the JSON loads back
// into a Handler equal to the one the Caddyfile describes: the two syntaxes say the
// same.
func TestExampleCaddyfile(t *testing.T) {
	input, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	out, warnings, err := caddyconfig.GetAdapter("caddyfile").Adapt(input, nil)
	if err != nil {
		t.Fatalf("adapting Caddyfile.example: %v", err)
	}
	for _, w := range warnings {
		t.Errorf("warning: line %d: %s: %s", w.Line, w.Directive, w.Message)
	}
	raw := findHandler(t, out)
	var h Handler
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	var withName struct {
		Handler string `json:"handler"`
		Handler2
	}
	if err := dec.Decode(&withName); err != nil {
		t.Fatalf("decoding %s: %v", raw, err)
	}
	h = Handler(withName.Handler2)
	want := Handler{
		DatabaseURL:      "{env.DATABASE_URL}",
		RedisURL:         "{env.REDIS_URL}",
		KeyPrefix:        "mon",
		GatewaySecret:    "{env.GATEWAY_SECRET}",
		IdentityKey:      "{env.IDENTITY_KEY}",
		StripFields:      defaultStripFields,
		LimiterFailure:   "open",
		DatabaseTimeout:  caddy.Duration(2 * time.Second),
		RedisTimeout:     caddy.Duration(200 * time.Millisecond),
		LegacyKeys:       "reject", // a made-up key of the old format costs no query
		LastUsedInterval: caddy.Duration(time.Minute),
	}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("the example's gateway is\n%+v\nwant\n%+v", h, want)
	}
	// Its handle_errors names each status as the module's own answers do.
	checkErrorNames(t, out)
	// Its servers bound slow clients.
	var servers struct {
		Apps struct {
			HTTP struct {
				Servers map[string]map[string]any `json:"servers"`
			} `json:"http"`
		} `json:"apps"`
	}
	if err := json.Unmarshal(out, &servers); err != nil {
		t.Fatal(err)
	}
	for name, srv := range servers.Apps.HTTP.Servers {
		for _, field := range []string{"read_header_timeout", "read_timeout", "idle_timeout"} {
			if srv[field] == nil {
				t.Errorf("server %s has no %s", name, field)
			}
		}
	}
	// And back: the JSON of that Handler is the adapted JSON.
	again, err := json.Marshal(struct {
		Handler string `json:"handler"`
		Handler2
	}{"v1_gateway", Handler2(h)})
	if err != nil {
		t.Fatal(err)
	}
	if !jsonEqual(t, again, raw) {
		t.Errorf("round trip:\n%s\nvs\n%s", again, raw)
	}
}

// checkErrorNames checks the map of the example's handle_errors, from status codes
// to the error names of /v1. Each is what statusBody says for that status.
func checkErrorNames(t *testing.T, cfg []byte) {
	t.Helper()
	var found bool
	var walk func(any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			if v["handler"] == "map" && fmt.Sprint(v["destinations"]) == "[{v1_error}]" {
				found = true
				for _, m := range v["mappings"].([]any) {
					m := m.(map[string]any)
					code, _ := strconv.Atoi(m["input"].(string))
					name := m["outputs"].([]any)[0]
					if want := string(statusBody(code)); `{"error":"`+fmt.Sprint(name)+`"}` != want {
						t.Errorf("handle_errors names %d %v; the module answers %s", code, name, want)
					}
				}
				if want := string(statusBody(599)); `{"error":"`+fmt.Sprint(v["defaults"].([]any)[0])+`"}` != want {
					t.Errorf("handle_errors names other statuses %v; the module answers %s", v["defaults"], want)
				}
			}
			for _, x := range v {
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	var doc any
	if err := json.Unmarshal(cfg, &doc); err != nil {
		t.Fatal(err)
	}
	walk(doc)
	if !found {
		t.Error("no map to {v1_error} in the example's handle_errors")
	}
}

// Handler2 is Handler without its methods, for embedding next to "handler".
type Handler2 Handler

// findHandler returns the JSON of the first v1_gateway handler in a config.
func findHandler(t *testing.T, cfg []byte) json.RawMessage {
	t.Helper()
	var found json.RawMessage
	var walk func(json.RawMessage)
	walk = func(raw json.RawMessage) {
		if found != nil {
			return
		}
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) == nil {
			if string(obj["handler"]) == `"v1_gateway"` {
				found = raw
				return
			}
			for _, v := range obj {
				walk(v)
			}
			return
		}
		var arr []json.RawMessage
		if json.Unmarshal(raw, &arr) == nil {
			for _, v := range arr {
				walk(v)
			}
		}
	}
	walk(cfg)
	if found == nil {
		t.Fatalf("no v1_gateway handler in %s", cfg)
	}
	return found
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		t.Fatal(err)
	}
	return reflect.DeepEqual(x, y)
}

// TestExampleCaddyfileServes runs Caddyfile.example itself against the test
// database, Redis and upstream. The operator's config does what
// docs/configuration.md says.
func TestExampleCaddyfileServes(t *testing.T) {
	gw, up, key := startExample(t)

	res, body := gw.get(t, "/v1/me", key)
	if res.StatusCode != http.StatusOK || res.Header.Get("Ratelimit-Policy") == "" {
		t.Errorf("GET /v1/me = %d %q %s", res.StatusCode, res.Header, body)
	}
	res, body = gw.get(t, "/v1/monitors", key)
	if res.StatusCode != http.StatusOK || strings.Contains(string(body), `"config"`) {
		t.Errorf("GET /v1/monitors = %d %s", res.StatusCode, body)
	}
	res, body = gw.do(t, "GET", "/v1/me", "", nil, "")
	wantJSONError(t, res, body, http.StatusUnauthorized, wantUnauthenticated)
	// The load balancer's health check needs no key.
	testenv.Eventually(t, 10*time.Second, "GET /healthz answering 200", func() bool {
		res, body = gw.do(t, "GET", "/healthz", "", nil, "")
		return res.StatusCode == http.StatusOK
	})
	if string(body) != `{"status":"ok"}` || up.requests() != 1 { // /v1/monitors
		t.Errorf("GET /healthz = %d %s; upstream saw %d requests", res.StatusCode, body, up.requests())
	}
	// A key in the query string does not authenticate, and is not logged.
	res, body = gw.do(t, "GET", "/v1/me?api_key="+key+"&access_token="+key+"&token="+key, "", http.Header{"X-Api-Key": {key}}, "")
	wantJSONError(t, res, body, http.StatusUnauthorized, wantUnauthenticated)
	// The dashboard route goes straight to the upstream, credentials and all.
	res, body = gw.do(t, "GET", "/v1x/echo", "", http.Header{"Cookie": {"session=abc"}}, "")
	if res.StatusCode != http.StatusNotFound || up.requests() != 2 { // /v1/monitors and this one
		t.Errorf("dashboard route = %d %s; upstream saw %d requests", res.StatusCode, body, up.requests())
	}
	// Nor does the dashboard route pass a client's X-Gateway-* fields, whatever their
	// case. Nor does it pass a client's key and cookie, for /v1 and for the paths Caddy
	// cleans out of /v1/*.
	forged := http.Header{
		"X-Gateway-Identity": {"forged"}, "X-Gateway-Org-Id": {"forged"}, "x-gateway-secret": {"forged"},
		"Cookie": {"session=abc"},
	}
	for _, tc := range []struct {
		path        string
		credentials bool // whether Authorization and Cookie go on
	}{
		{"/orgs/x/api-keys", true},
		{"/v1", false},
		{"/v1/../echo", false},
		{"//V1/%2e%2e/echo", false},
		{"/v1x/echo", true},
	} {
		before := up.requests()
		gw.do(t, "GET", tc.path, "Bearer "+key, forged, "")
		up.mu.Lock()
		if len(up.seen) != before+1 {
			t.Errorf("%s: the upstream saw %d requests, want 1", tc.path, len(up.seen)-before)
			up.mu.Unlock()
			continue
		}
		seen := up.seen[before].Header
		up.mu.Unlock()
		for name := range seen {
			if strings.HasPrefix(strings.ToLower(name), "x-gateway-") {
				t.Errorf("%s: the upstream got the client's %s", tc.path, name)
			}
		}
		if got := seen.Get("Authorization") != "" && seen.Get("Cookie") != ""; got != tc.credentials {
			t.Errorf("%s: the upstream got Authorization %q and Cookie %q", tc.path, seen.Get("Authorization"), seen.Get("Cookie"))
		}
	}
	// What Caddy refuses itself on /v1 is JSON too, in the gateway's words.
	longMethod := strings.Repeat("M", 33)
	for _, tc := range []struct {
		name, method, host string
		status             int
		body               string
	}{
		{"a method over 32 characters", longMethod, "", http.StatusMethodNotAllowed, `{"error":"method_not_allowed"}`},
		{"a host of dots", "GET", "...", http.StatusBadRequest, `{"error":"bad_request"}`},
	} {
		req, err := http.NewRequest(tc.method, gw.base+"/v1/me", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = cmp.Or(tc.host, req.Host)
		res, body := testenv.Exchange(t, gw.client, req)
		t.Run(tc.name, func(t *testing.T) { wantJSONError(t, res, body, tc.status, tc.body) })
	}
	res, body = rawExchange(t, strings.TrimPrefix(gw.base, "http://"), "GET /v1/me HTTP/1.1\r\nHost:\r\nConnection: close\r\n\r\n")
	t.Run("an empty Host", func(t *testing.T) { wantJSONError(t, res, body, http.StatusBadRequest, `{"error":"bad_request"}`) })

	// The proxied request carries the signed identity, which verifies against the JWKS
	// the example publishes.
	verifier, err := gatewayauth.New(gatewayauth.Config{JWKSURL: gw.base + "/.well-known/jwks.json"})
	if err != nil {
		t.Fatal(err)
	}
	res, body = gw.get(t, "/v1/echo", key)
	var seen seenRequest
	_ = json.Unmarshal(body, &seen)
	assertion := seen.Header.Get(gatewayauth.Header)
	if id, err := verifier.Verify(context.Background(), assertion); res.StatusCode != http.StatusOK || err != nil || id.KeyID == "" {
		t.Errorf("GET /v1/echo = %d, the upstream's assertion %q verifies as %+v, %v", res.StatusCode, assertion, id, err)
	}
	// The gateway secret and the assertion stay out of the log even when the proxy
	// logs headers.
	if res, err := gw.client.Do(mustRequest(t, gw.base+"/v1/invalid-json", key)); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	// Keys the example's log filter must redact. They come percent-encoded in the URI,
	// in headers of any name, split over two values of one header, as a header's name,
	// as the Host and as the method.
	id, secret, _ := strings.Cut(key, ".")
	encoded := strings.NewReplacer("_", "%5F", ".", "%2E").Replace(key)
	for _, tc := range []struct {
		method, host, path string
		hdr                http.Header
	}{
		{"GET", "", "/v1/me?k=" + encoded, nil},
		{"GET", "", "/v1/me?k=" + strings.ReplaceAll(encoded, "%", "%25"), nil}, // encoded twice
		{"GET", "", "/v1/me/" + id + "%2e" + secret, nil},
		{"GET", "", "/v1/me", http.Header{"Api-Key": {key}, "X-Auth-Token": {"Bearer " + key}, "Referer": {"https://app.example/?key=" + encoded}}},
		{"GET", "", "/v1/me", http.Header{"X-Api-Key": {key[:30], key[30:]}, "X-Api-Token": {id, secret}}},
		{"GET", "", "/v1/me", http.Header{key: {"x"}}},
		{"GET", key, "/v1/me", nil},
		{key, "", "/v1/me", nil},
	} {
		req, err := http.NewRequest(tc.method, gw.base+tc.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Host = cmp.Or(tc.host, req.Host)
		maps.Copy(req.Header, tc.hdr)
		testenv.Exchange(t, gw.client, req)
	}
	var log []byte
	testenv.Eventually(t, 10*time.Second, "the error and access log lines in "+gw.logPath, func() bool {
		log, _ = os.ReadFile(gw.logPath)
		return strings.Contains(string(log), "aborting with incomplete response") && strings.Contains(string(log), `"logger":"http.log.access`) &&
			strings.Contains(string(log), "REDACTED")
	})
	for _, leak := range []string{testSecret, assertion, secret, secret[:16], strings.ReplaceAll(secret, "_", "%5F")[:16]} {
		if strings.Contains(string(log), leak) {
			t.Errorf("the log shows %q:\n%s", leak, log)
		}
	}
	// A header's name is logged canonicalized, mostly in lower case.
	if strings.Contains(strings.ToLower(string(log)), strings.ToLower(secret[:16])) {
		t.Errorf("the log shows the secret in lower case:\n%s", log)
	}
}

// startExample loads Caddyfile.example in this process, in front of a test upstream,
// with a fresh database holding an Editor key, which it returns.
func startExample(t *testing.T) (gw *gateway, up *testUpstream, key string) {
	t.Helper()
	d, key, _ := newDBWithKey(t)
	up = newUpstream(t)
	listen := freeAddr(t)
	// A site of any host, as the example's :8080. So a request with a bad Host still
	// reaches its handle_errors.
	t.Setenv("GATEWAY_ADDR", "http://:"+listen[strings.LastIndexByte(listen, ':')+1:])
	t.Setenv("UPSTREAM_ADDR", up.addr())
	t.Setenv("DATABASE_URL", d.url)
	t.Setenv("REDIS_URL", redisURL(t))
	t.Setenv("GATEWAY_SECRET", testSecret)
	_, identityKey := gatewayauthtest.NewKey(t)
	t.Setenv("IDENTITY_KEY", identityKey)

	input, err := os.ReadFile("../Caddyfile.example")
	if err != nil {
		t.Fatal(err)
	}
	cfg, _, err := caddyconfig.GetAdapter("caddyfile").Adapt(input, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The example logs to stderr; keep the test output quiet.
	logPath := filepath.Join(t.TempDir(), "caddy.log")
	cfg = []byte(strings.Replace(string(cfg), `"logging":{"logs":{"default":{`,
		`"admin":{"disabled":true,"config":{"persist":false}},"logging":{"logs":{"default":{"writer":{"output":"file","filename":`+strconv.Quote(logPath)+`},`, 1))
	if err := caddy.Load(cfg, true); err != nil {
		t.Fatalf("loading the example: %v\n%s", err, cfg)
	}
	t.Cleanup(func() { _ = caddy.Stop() })
	gw = &gateway{base: "http://" + listen, logPath: logPath, client: &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}
	return gw, up, key
}
