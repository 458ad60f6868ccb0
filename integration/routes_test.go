package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/caddymodule/routetable"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/internal/testkit/timingpair"
)

// reportsService is a platform team's own service behind the gateway: a Go 1.22
// http.ServeMux with its routes under /v1/reports, answering JSON. It notes the
// method and target of every request as it reached it: those the gateway decided,
// which carry a key's identity, apart from the others, which the site's other route
// sends here too.
type reportsService struct {
	mu        sync.Mutex
	seen      []string // with a key's identity
	anonymous []string // without
}

func newReportsService(t *testing.T) (*reportsService, string) {
	t.Helper()
	svc := &reportsService{}
	mux := http.NewServeMux()
	reply := func(what string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprintf(w, `{"route":%q,"id":%q}`, what, r.PathValue("id"))
		}
	}
	mux.HandleFunc("GET /v1/reports/{id}", reply("read"))
	mux.HandleFunc("POST /v1/reports/{id}", reply("write"))
	mux.HandleFunc("GET /v1/me", reply("the service's me"))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		io.WriteString(w, `{"error":"not_found"}`)
	})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		svc.mu.Lock()
		if r.Header.Get("X-Gateway-Key-Id") != "" {
			svc.seen = append(svc.seen, r.Method+" "+r.RequestURI)
		} else {
			svc.anonymous = append(svc.anonymous, r.Method+" "+r.RequestURI)
		}
		svc.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv.Listener = l
	srv.Start()
	t.Cleanup(srv.Close)
	return svc, l.Addr().String()
}

// requests returns the requests the service has seen with a key's identity.
func (svc *reportsService) requests() []string {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return append([]string(nil), svc.seen...)
}

// anonymousRequests returns the requests the service has seen without an identity.
func (svc *reportsService) anonymousRequests() []string {
	svc.mu.Lock()
	defer svc.mu.Unlock()
	return append([]string(nil), svc.anonymous...)
}

// reportsTable is the route table of the gateway in front of the reports service.
var reportsTable = []string{
	"route GET /v1/reports/* scope reports:read cost 20",
	"route POST /v1/reports/* scope reports:write cost 50",
	"route GET /v1/me",
}

// reportsGateway starts, beside the stack's two gateways, a third whose route table is
// reportsTable and whose /v1 goes to a reports service. It returns the service and
// the gateway's index.
func (s *Stack) reportsGateway() (*reportsService, int) {
	s.t.Helper()
	svc, addr := newReportsService(s.t)
	upstream, options := s.upAddr, s.gwOptions
	s.upAddr, s.gwOptions = addr, strings.Join(reportsTable, "\n\t\t\t")
	s.startGateway("open")
	s.upAddr, s.gwOptions = upstream, options
	return svc, len(s.gateways) - 1
}

// rawDo sends one request to gateway gw with its target exactly as given, on a
// connection of its own, and returns the answer. Go's client cleans or refuses some
// targets a test must send (a backslash), and the OpenAPI check of doRequest knows
// nothing of a service's own routes.
func (s *Stack) rawDo(gw int, method, target, key string, body string) Resp {
	s.t.Helper()
	conn, err := net.DialTimeout("tcp", s.gateways[gw].addr, 10*time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	var req strings.Builder
	fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, target, s.gateways[gw].addr)
	if key != "" {
		fmt.Fprintf(&req, "Authorization: Bearer %s\r\n", key)
	}
	if body != "" {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, req.String()); err != nil {
		s.t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, target, err)
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		s.t.Fatalf("%s %s: reading the body: %v", method, target, err)
	}
	return Resp{Status: res.StatusCode, Header: res.Header, Body: b}
}

// remaining is what the key's minute has left after r, from its RateLimit field.
func remaining(t *testing.T, r Resp) int {
	t.Helper()
	m := regexp.MustCompile(`"default";r=(\d+);`).FindStringSubmatch(r.Header.Get("RateLimit"))
	if m == nil {
		t.Fatalf("no RateLimit for the key in %d %s: %q", r.Status, r.Body, r.Header.Get("RateLimit"))
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestAScopeTheOperatorAddsIsUsedByAKeyAndARoute: reports:read is no scope until
// `upstream scope put` adds it; then a key carries it and a route of the gateway's
// table needs it, end to end, with no change to any Go code.
func TestAScopeTheOperatorAddsIsUsedByAKeyAndARoute(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	r := owner.do("POST", "/orgs/"+org.ID+"/api-keys", map[string]any{"name": "r", "role": "Viewer", "scopes": []string{"reports:read"}}, nil)
	wantError(t, r, http.StatusBadRequest,
		`{"error":"invalid_request","message":"scopes: \"reports:read\" is not a scope: use monitors:read, monitors:write or monitors:delete"}`)
	s.cli("", "scope", "put", "--name", "reports:read", "--description", "Read reports")
	_, reader := owner.createKeyWith(org.ID, "reader", "Viewer", map[string]any{"scopes": []string{"reports:read"}})
	_, monitors := owner.createKeyWith(org.ID, "monitors", "Viewer", map[string]any{"scopes": []string{"monitors:read"}})
	svc, gw := s.reportsGateway()

	if r := s.rawDo(gw, "GET", "/v1/reports/q1", reader, ""); r.Status != http.StatusOK || string(r.Body) != `{"route":"read","id":"q1"}` {
		t.Errorf("the key with reports:read: %d %s", r.Status, r.Body)
	}
	wantError(t, s.rawDo(gw, "GET", "/v1/reports/q1", monitors, ""), http.StatusForbidden, scopeForbidden("reports:read"))
	// No rule of this table names /v1/monitors: a scoped key is refused there.
	wantError(t, s.rawDo(gw, "GET", "/v1/monitors", reader, ""), http.StatusForbidden, `{"error":"forbidden","reason":"scope"}`)
	if got := svc.requests(); strings.Join(got, ",") != "GET /v1/reports/q1" {
		t.Errorf("the service saw %q, want the one request allowed", got)
	}
	// A scope a live key holds stays.
	if out, err := s.cliRaw("", "scope", "delete", "--name", "reports:read"); err == nil || !strings.Contains(string(out), "a live key holds scope reports:read") {
		t.Errorf("scope delete of a scope a key holds: %v %s", err, out)
	}
}

// TestThePathDecidedIsThePathSent sends, through the gateway to a Go 1.22 ServeMux
// service, every spelling of a path that the route table, which cleans and decodes,
// and the service, which splits at "/" and decodes each segment, could read
// differently: each is refused 400 before its key is even looked up, charges nothing
// and never reaches the service. Every other request is scoped and charged as the
// path the service routes, HEAD as its GET.
func TestThePathDecidedIsThePathSent(t *testing.T) {
	s := newStack(t)
	s.cli("", "scope", "put", "--name", "reports:read")
	s.cli("", "scope", "put", "--name", "reports:write")
	org, owner := s.newOwner("pro")
	_, writer := owner.createKeyWith(org.ID, "writer", "Editor", map[string]any{"scopes": []string{"monitors:write"}})
	_, reader := owner.createKeyWith(org.ID, "reader", "Editor", map[string]any{"scopes": []string{"reports:read"}, "rate_limit": 500})
	_, admin := owner.createKeyWith(org.ID, "admin", "Admin", map[string]any{"rate_limit": 500})
	svc, gw := s.reportsGateway()
	waitForWindowRoom(20)

	// The spellings, each as a key lacking the route's scope and as one having
	// it: refused either way, the same 400.
	for target, problem := range map[string]string{
		"/v1/reports/q1%2F..%2F..%2Fme":  routetable.PathEncoded,
		"/v1/reports/q1%2f..%2f..%2fme":  routetable.PathEncoded,
		"/v1/reports/q1%2F..%2F..%2Fx":   routetable.PathEncoded,
		"/v1/monitors/..%2Fme":           routetable.PathEncoded,
		"/v1/reports/%2e%2e/q1":          routetable.PathEncoded,
		"/v1/reports/q1/%2E%2E/%2e%2e/x": routetable.PathEncoded,
		"/v1/reports/q1%2Fx":             routetable.PathEncoded,
		"/v1/reports/q1/../../me":        routetable.PathDotSegment,
		"/v1/monitors/../me":             routetable.PathDotSegment,
		"/v1/reports/./q1":               routetable.PathDotSegment,
		"/v1/reports/q1/..":              routetable.PathDotSegment,
		"/v1//reports/q1":                routetable.PathEmptySegment,
		"/v1/reports//q1":                routetable.PathEmptySegment,
		"/v1/reports%5Cq1":               routetable.PathBackslash,
		"/v1/reports\\q1":                routetable.PathBackslash,
		"/v1/reports/q1%2F..%2F..%2Fme?": routetable.PathEncoded,
	} {
		want := `{"error":"invalid_request","message":` + strconv.Quote(problem) + `}`
		for _, key := range []string{writer, reader, ""} {
			for _, method := range []string{"GET", "POST"} {
				r := s.rawDo(gw, method, target, key, "")
				if r.Status != http.StatusBadRequest || string(r.Body) != want || r.Header.Get("Content-Type") != "application/json" {
					t.Errorf("%s %s: %d %s %s, want 400 %s", method, target, r.Status, r.Header.Get("Content-Type"), r.Body, want)
				}
				if r.Header.Get("RateLimit") != "" {
					t.Errorf("%s %s: a RateLimit field on a refusal made before the key", method, target)
				}
			}
		}
	}
	if got := svc.requests(); len(got) != 0 {
		t.Errorf("the service saw %q, want nothing of the refused paths", got)
	}
	// A path that climbs out of /v1 once cleaned is no /v1 path to Caddy's matcher:
	// the site's other route gets it, and it reaches a service with no identity and,
	// in Caddyfile.example, without the key (request_header @v1Raw -Authorization).
	s.rawDo(gw, "GET", "/v1/reports/%2e%2e/%2e%2e/me", reader, "")
	if got := svc.requests(); len(got) != 0 {
		t.Errorf("the service saw %q with an identity, want nothing", got)
	}
	if got := svc.anonymousRequests(); len(got) != 1 {
		t.Errorf("the service saw %q without an identity, want the one request the gateway was not asked about", got)
	}

	// Charged and scoped as the service routes them.
	left := remaining(t, s.rawDo(gw, "GET", "/v1/me", reader, ""))
	wantError(t, s.rawDo(gw, "GET", "/v1/reports/q1", writer, ""), http.StatusForbidden, scopeForbidden("reports:read"))
	if r := s.rawDo(gw, "HEAD", "/v1/reports/q1", writer, ""); r.Status != http.StatusForbidden {
		t.Errorf("HEAD /v1/reports/q1 without reports:read: %d, want 403", r.Status)
	}
	wantError(t, s.rawDo(gw, "GET", "/v1/REPORTS/q1", writer, ""), http.StatusForbidden, scopeForbidden("reports:read"))
	for _, tc := range []struct {
		method, target string
		key            string
		status         int
		cost           int
	}{
		{"GET", "/v1/reports/q1", reader, 200, 20},
		{"HEAD", "/v1/reports/q1", reader, 200, 20}, // a rule naming GET weighs HEAD alike
		{"GET", "/v1/reports/q%31", reader, 200, 20},
		{"GET", "/v1/me", reader, 200, 1},
	} {
		r := s.rawDo(gw, tc.method, tc.target, tc.key, "")
		if r.Status != tc.status {
			t.Fatalf("%s %s: %d %s, want %d", tc.method, tc.target, r.Status, r.Body, tc.status)
		}
		if got := remaining(t, r); got != left-tc.cost {
			t.Errorf("%s %s: %d left, want %d: it costs %d", tc.method, tc.target, got, left-tc.cost, tc.cost)
		}
		left -= tc.cost
	}
	adminLeft := remaining(t, s.rawDo(gw, "GET", "/v1/me", admin, ""))
	if r := s.rawDo(gw, "POST", "/v1/reports/q1", admin, `{}`); r.Status != http.StatusOK || remaining(t, r) != adminLeft-50 {
		t.Errorf("POST /v1/reports/q1 as an Admin: %d %s, %d left; want 200 and %d", r.Status, r.Body, remaining(t, r), adminLeft-50)
	}
	want := []string{"GET /v1/reports/q1", "HEAD /v1/reports/q1", "GET /v1/reports/q%31", "POST /v1/reports/q1"}
	if got := svc.requests(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("the service saw %q, want %q", got, want)
	}
}

// TestACostOverAMillionIsRefusedByCaddyValidate: caddy validate refuses a route
// costing 10^17, in a Caddyfile and in JSON, and a JSON cost of 0, before it
// connects to anything.
func TestACostOverAMillionIsRefusedByCaddyValidate(t *testing.T) {
	bin := binaries(t)
	dir := t.TempDir()
	handler := func(cost string) string {
		return `{"apps":{"http":{"servers":{"gw":{"listen":["127.0.0.1:0"],"routes":[{"handle":[{"handler":"v1_gateway",` +
			`"database_url":"postgres://x@127.0.0.1:1/x","gateway_secret":"s","routes":[{"methods":["GET"],"path":"/v1/reports/*","cost":` + cost + `}]}]}]}}}}}`
	}
	for _, tc := range []struct {
		name, file, config, want string
	}{
		{"a Caddyfile route of 10^17", "Caddyfile", ":0 {\n\tv1_gateway {\n\t\tdatabase_url postgres://x@127.0.0.1:1/x\n\t\tgateway_secret s\n" +
			"\t\troute GET /v1/reports/* cost 100000000000000000\n\t}\n}\n", "cost 100000000000000000 must be from 1 to 1000000"},
		{"a JSON route of 10^17", "caddy.json", handler("100000000000000000"), "cost 100000000000000000 must be from 1 to 1000000"},
		{"a JSON route of 1000001", "caddy.json", handler("1000001"), "cost 1000001 must be from 1 to 1000000"},
		{"a JSON route of 0", "caddy.json", handler("0"), "cost 0 must be from 1 to 1000000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.file)
			if err := os.WriteFile(path, []byte(tc.config), 0o600); err != nil {
				t.Fatal(err)
			}
			args := []string{"validate", "--config", path}
			if tc.file == "Caddyfile" {
				args = append(args, "--adapter", "caddyfile")
			}
			cmd := exec.Command(filepath.Join(bin, "caddy"), args...)
			cmd.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
			out, err := cmd.CombinedOutput()
			if err == nil || !strings.Contains(string(out), tc.want) {
				t.Errorf("caddy validate: %v, want it refused with %q:\n%s", err, tc.want, out)
			}
		})
	}
}

// TestAKeyRevokedByTheOperatorIsRefusedOnItsNextRequest: `upstream key revoke` takes
// effect on the key's very next request on every gateway, as the dashboard's does, and
// the organisation's audit trail says the operator did it, as it does of `org
// set-plan`; `upstream audit list` has the plan changes.
func TestAKeyRevokedByTheOperatorIsRefusedOnItsNextRequest(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	id, key := owner.createKey(org.ID, "ci", "Editor", nil)
	for gw := range 2 {
		if r := s.api(key, gw).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
			t.Fatalf("gateway %d before the revocation: %d %s", gw, r.Status, r.Body)
		}
	}
	var list struct{ Keys []struct{ ID, Name string } }
	out, err := s.cliRaw("", "key", "list", "--org", org.ID)
	if err != nil || json.Unmarshal(out, &list) != nil || len(list.Keys) != 1 || list.Keys[0].ID != id {
		t.Fatalf("key list: %v %s", err, out)
	}
	if got := s.cli("", "key", "revoke", "--org", org.ID, "--id", id); got["revoked"] != true {
		t.Errorf("key revoke printed %v", got)
	}
	for gw := range 2 {
		wantError(t, s.api(key, gw).do("GET", "/v1/me", nil), http.StatusUnauthorized, `{"error":"api key unauthenticated"}`)
	}
	s.cli("", "org", "set-plan", "--org", org.ID, "--plan", "enterprise")

	r := owner.do("GET", "/orgs/"+org.ID+"/audit-events", nil, nil)
	var trail struct {
		Data []struct {
			Action  string         `json:"action"`
			KeyID   string         `json:"key_id"`
			Actor   string         `json:"actor"`
			Changes map[string]any `json:"changes"`
		}
	}
	if err := json.Unmarshal(r.Body, &trail); err != nil || len(trail.Data) < 3 {
		t.Fatalf("the audit trail: %d %s", r.Status, r.Body)
	}
	got := fmt.Sprintf("%s by %s %v; %s of %s by %s", trail.Data[0].Action, trail.Data[0].Actor, trail.Data[0].Changes["plan"],
		trail.Data[1].Action, trail.Data[1].KeyID, trail.Data[1].Actor)
	if want := "org.plan_changed by operator map[from:pro to:enterprise]; key.revoked of " + id + " by operator"; got != want {
		t.Errorf("the audit trail's newest: %s, want %s", got, want)
	}

	s.cli("", "plan", "set", "--name", "pro", "--org-rate-limit", "900")
	if got := s.cli("", "plan", "get", "pro"); got["org_rate_limit"] != 900.0 {
		t.Errorf("plan get pro: %v", got)
	}
	events := s.cli("", "audit", "list")["events"].([]any)
	newest := events[0].(map[string]any)
	changes := newest["changes"].(map[string]any)
	if newest["action"] != "plan.updated" || newest["subject"] != "pro" || newest["actor"] != "operator" ||
		changes["from"].(map[string]any)["org_rate_limit"] != -1.0 || changes["to"].(map[string]any)["org_rate_limit"] != 900.0 {
		t.Errorf("audit list's newest: %v", newest)
	}
}

// TestTheLoginThrottleBehindATrustedBalancerKeepsTheVictimsLogin puts a balancer
// (127.0.0.2, which the gateway trusts and the upstream does not know) before the
// gateway: five wrong passwords from one client do not lock out the right password
// from another, since the gateway sends the upstream the client's address (header_up
// X-Forwarded-For {client_ip}, as Caddyfile.example does) and the upstream walks
// X-Forwarded-For past the proxies it trusts.
func TestTheLoginThrottleBehindATrustedBalancerKeepsTheVictimsLogin(t *testing.T) {
	s := newStackWith(t, stackOptions{
		globalOptions: "servers {\n\t\ttrusted_proxies static 127.0.0.2/32\n\t\ttrusted_proxies_strict\n\t}",
		upstreamArgs:  []string{"--trusted-proxies", "127.0.0.1/32"},
	})
	org := s.newOrg("pro")
	balancer := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}).DialContext,
	}}
	login := func(client, password string) Resp {
		return doRequest(t, balancer, "POST", s.URL(0)+"/auth/login", map[string]string{"email": org.Email, "password": password},
			http.Header{"X-Forwarded-For": {"192.0.2.99, " + client}})
	}
	const attacker, victim = "203.0.113.1", "203.0.113.2"
	statuses := ""
	for range 5 {
		statuses += strconv.Itoa(login(attacker, "wrong password").Status) + " "
	}
	if statuses != "401 401 401 401 401 " {
		t.Errorf("five wrong passwords: %s", statuses)
	}
	if r := login(attacker, org.Password); r.Status != http.StatusTooManyRequests {
		t.Errorf("the attacker's right password after five wrong: %d %s, want 429", r.Status, r.Body)
	}
	if r := login(victim, org.Password); r.Status != http.StatusNoContent {
		t.Errorf("the victim's right password from another client: %d %s, want 204", r.Status, r.Body)
	}
}

// TestA413ForADeclaredBodyComesAtOnce: a client that sends the headers of a body over
// max_request_body and waits, with Expect: 100-continue or without, gets the 413
// within a second, and the connection closes, rather than the server waiting for a
// body it will not read.
func TestA413ForADeclaredBodyComesAtOnce(t *testing.T) {
	s := newStack(t)
	_, key := s.newKey("pro", "Editor")
	for _, expect := range []bool{false, true} {
		conn, err := net.DialTimeout("tcp", s.gateways[0].addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(30 * time.Second))
		head := "POST /v1/monitors HTTP/1.1\r\nHost: " + s.gateways[0].addr + "\r\nAuthorization: Bearer " + key +
			"\r\nContent-Type: application/json\r\nContent-Length: 2097152\r\n"
		if expect {
			head += "Expect: 100-continue\r\n"
		}
		start := time.Now()
		if _, err := io.WriteString(conn, head+"\r\n"); err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(conn)
		res, err := http.ReadResponse(br, &http.Request{Method: "POST"})
		if err != nil {
			t.Fatalf("Expect %v: %v", expect, err)
		}
		body, _ := io.ReadAll(res.Body)
		took := time.Since(start)
		if res.StatusCode != http.StatusRequestEntityTooLarge || string(body) != `{"error":"request_too_large"}` || !res.Close {
			t.Errorf("Expect %v: %d %s, Connection: close %v; want the 413, closing", expect, res.StatusCode, body, res.Close)
		}
		if took > time.Second {
			t.Errorf("Expect %v: the 413 took %v, want under a second", expect, took)
		}
		if rest, err := io.ReadAll(br); err != nil || len(rest) != 0 || time.Since(start) > 2*time.Second {
			t.Errorf("Expect %v: after the 413, %q %v after %v; want the connection closed", expect, rest, err, time.Since(start))
		}
	}
}

// TestARefusedRestrictedKeyClosesAsSoonAsAnUnknownKey times, over 2,000 interleaved
// pairs, each on a connection of its own, a live key used from outside its networks
// against an unknown key of the same shape, from the request to the gateway's close
// of the connection: the second look that tells the first apart runs once the
// handler has returned, so neither is the slower in more than 55 % of pairs. The look
// still counts each refusal of the live key as ip_denied.
func TestARefusedRestrictedKeyClosesAsSoonAsAnUnknownKey(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	_, restricted := owner.createKeyWith(org.ID, "elsewhere", "Admin", map[string]any{"allowed_cidrs": []string{"10.0.0.0/8"}})
	unknown := unknownKeyLike(restricted)
	const warmup, pairs = 200, 2000
	before := s.gatewayMetric(0, `keygate_requests_total{outcome="ip_denied"}`)
	res, err := timingpair.RunClosing(
		timingpair.Request{Name: "a key refused for its address", URL: s.URL(0) + "/v1/me", Key: restricted},
		timingpair.Request{Name: "an unknown key", URL: s.URL(0) + "/v1/me", Key: unknown}, warmup, pairs)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d pairs to the close: the restricted key's median %v, the slower in %.1f %%; the unknown key's %v, %.1f %%",
		res.Pairs, res.MedianA, 100*res.ASlower, res.MedianB, 100*res.BSlower)
	if res.Status != http.StatusUnauthorized || !res.IdenticalBytes {
		t.Errorf("the answers: status %d, every one byte for byte alike %v; want the one 401", res.Status, res.IdenticalBytes)
	}
	if res.ASlower > 0.55 || res.BSlower > 0.55 {
		t.Errorf("the restricted key was the slower to the close in %.1f %% of pairs, the unknown key in %.1f %%: want neither above 55 %%",
			100*res.ASlower, 100*res.BSlower)
	}
	testenv.Eventually(t, 30*time.Second, "every refusal of the restricted key counted as ip_denied", func() bool {
		return s.gatewayMetric(0, `keygate_requests_total{outcome="ip_denied"}`)-before == warmup+pairs
	})
}
