package integration

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

// scopeForbidden is the 403 of a scoped key lacking its route's scope.
func scopeForbidden(scope string) string {
	return `{"error":"forbidden","reason":"scope","required_scope":"` + scope + `"}`
}

// TestScopedKeysOnEveryV1Route: keys of each role with scopes, on every /v1 route of
// the built-in table, through both gateways: a route needs its scope, a scope never
// widens a role, GET /v1/me needs none, and an unscoped key is its role alone.
func TestScopedKeysOnEveryV1Route(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	_, setup := owner.createKey(org.ID, "setup", "Admin", nil)
	mon := s.api(setup, 0).do("POST", "/v1/monitors", newMonitor("a"))
	if mon.Status != http.StatusCreated {
		t.Fatalf("creating a monitor: %d %s", mon.Status, mon.Body)
	}
	id := mon.JSON(t)["id"].(string)
	const read, write, del = "monitors:read", "monitors:write", "monitors:delete"
	type call struct{ method, path, need string }
	calls := []call{
		{"GET", "/v1/monitors", read}, {"GET", "/v1/monitors/" + id, read},
		{"PATCH", "/v1/monitors/" + id, write}, {"POST", "/v1/monitors", write},
		{"GET", "/v1/me", ""},
	}
	for i, tc := range []struct {
		role   string
		scopes []string
	}{
		{"Editor", []string{read}},
		{"Editor", []string{read, write}},
		{"Admin", []string{write}},
		{"Viewer", []string{read}},
		{"Editor", nil},
	} {
		fields := map[string]any{}
		if tc.scopes != nil {
			fields["scopes"] = tc.scopes
		}
		_, key := owner.createKeyWith(org.ID, fmt.Sprintf("k%d", i), tc.role, fields)
		for j, c := range calls {
			var body any
			if c.method == "POST" || c.method == "PATCH" {
				body = map[string]any{"name": fmt.Sprintf("m%d", i), "type": "http", "target": "https://example.com"}
			}
			r := s.api(key, j%2).do(c.method, c.path, body)
			has := tc.scopes == nil || c.need == "" || contains(tc.scopes, c.need)
			switch {
			case tc.role == "Viewer" && c.method != "GET":
				wantError(t, r, 403, `{"error":"forbidden","reason":"role","required_role":"Editor"}`)
			case !has:
				wantError(t, r, 403, scopeForbidden(c.need))
			case r.Status >= 300:
				t.Errorf("%s %v, %s %s: %d %s, want it through", tc.role, tc.scopes, c.method, c.path, r.Status, r.Body)
			}
		}
		if tc.scopes != nil {
			me := s.api(key, 0).do("GET", "/v1/me", nil).JSON(t)
			got, _ := json.Marshal(me["scopes"])
			if want, _ := json.Marshal(tc.scopes); string(got) != string(want) {
				t.Errorf("GET /v1/me of %v: scopes %s", tc.scopes, got)
			}
		}
		// DELETE last: it needs monitors:delete, which none of the scoped keys has.
		if tc.scopes != nil && tc.role != "Viewer" {
			wantError(t, s.api(key, 1).do("DELETE", "/v1/monitors/"+id, nil), 403, scopeForbidden(del))
		}
	}
	_, deleter := owner.createKeyWith(org.ID, "deleter", "Admin", map[string]any{"scopes": []string{del}})
	if r := s.api(deleter, 0).do("DELETE", "/v1/monitors/"+id, nil); r.Status != http.StatusNoContent {
		t.Errorf("DELETE with monitors:delete: %d %s", r.Status, r.Body)
	}
}

// contains reports whether list holds s.
func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// TestAKeysScopesChangeOnTheNextRequest: the key PATCH's scopes apply from the next
// request on, on every gateway; null makes the key unscoped again.
func TestAKeysScopesChangeOnTheNextRequest(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	id, key := owner.createKeyWith(org.ID, "ci", "Editor", map[string]any{"scopes": []string{"monitors:read"}})
	wantError(t, s.api(key, 0).do("POST", "/v1/monitors", newMonitor("a")), 403, scopeForbidden("monitors:write"))
	patch := func(scopes any) {
		t.Helper()
		if r := owner.do("PATCH", "/orgs/"+org.ID+"/api-keys/"+id, map[string]any{"scopes": scopes}, nil); r.Status != http.StatusOK {
			t.Fatalf("PATCH scopes %v: %d %s", scopes, r.Status, r.Body)
		}
	}
	patch([]string{"monitors:read", "monitors:write"})
	r := s.api(key, 1).do("POST", "/v1/monitors", newMonitor("a"))
	if r.Status != http.StatusCreated {
		t.Fatalf("POST after monitors:write was granted: %d %s", r.Status, r.Body)
	}
	mid := r.JSON(t)["id"].(string)
	wantError(t, s.api(key, 0).do("DELETE", "/v1/monitors/"+mid, nil), 403, scopeForbidden("monitors:delete"))
	patch([]string{"monitors:read"})
	wantError(t, s.api(key, 1).do("PATCH", "/v1/monitors/"+mid, map[string]any{"name": "b"}), 403, scopeForbidden("monitors:write"))
	patch(nil)
	if r := s.api(key, 0).do("DELETE", "/v1/monitors/"+mid, nil); r.Status != http.StatusNoContent {
		t.Errorf("DELETE once unscoped: %d %s", r.Status, r.Body)
	}
}

// TestACustomRouteTableWeighsRoutesExactlyAcrossGateways: both gateways with the
// operator's table. A cost-5 route takes 5 of the key's minute on either; with 3 left
// it is refused whole and counts nothing, so cheaper requests still use the 3.
func TestACustomRouteTableWeighsRoutesExactlyAcrossGateways(t *testing.T) {
	s := newStackWith(t, stackOptions{gwOptions: strings.Join([]string{
		"route GET,HEAD /v1/monitors* scope monitors:read",
		"route POST /v1/monitors scope monitors:write cost 5",
		"route GET /v1/me",
	}, "\n\t\t\t")})
	org, owner := s.newOwner("pro")
	for _, scopes := range [][]string{nil, {"monitors:read", "monitors:write"}} {
		fields := map[string]any{"rate_limit": 8}
		if scopes != nil {
			fields["scopes"] = scopes
		}
		_, key := owner.createKeyWith(org.ID, fmt.Sprint("k", len(scopes)), "Editor", fields)
		waitForWindowRoom(20)
		for i, step := range []struct {
			gw           int
			method, path string
			status       int
			left         int
		}{
			{0, "POST", "/v1/monitors", 201, 3},
			{1, "POST", "/v1/monitors", 429, 3}, // 5 with 3 left: nothing counted
			{0, "POST", "/v1/monitors", 429, 3},
			{1, "GET", "/v1/monitors", 200, 2},
			{0, "GET", "/v1/me", 200, 1},
			{1, "GET", "/v1/monitors", 200, 0},
			{0, "GET", "/v1/monitors", 429, 0},
		} {
			var body any
			if step.method == "POST" {
				body = newMonitor(fmt.Sprint("m", i))
			}
			r := s.api(key, step.gw).do(step.method, step.path, body)
			want := fmt.Sprintf(`"default";r=%d;t=`, step.left)
			if r.Status != step.status || !strings.HasPrefix(r.Header.Get("RateLimit"), want) {
				t.Errorf("scopes %v, step %d (%s %s on gateway %d): %d %s RateLimit %q; want %d and %s…",
					scopes, i, step.method, step.path, step.gw, r.Status, r.Body, r.Header.Get("RateLimit"), step.status, want)
			}
			if step.status == 429 && !strings.Contains(string(r.Body), `"budget":"key"`) {
				t.Errorf("step %d: 429 %s", i, r.Body)
			}
		}
		if scopes != nil {
			// No rule of this table names DELETE: a scoped key is refused it, whatever
			// its scopes (a fresh key: this one's minute is spent).
			_, fresh := owner.createKeyWith(org.ID, "fresh", "Editor", map[string]any{"scopes": []string{"monitors:read", "monitors:write", "monitors:delete"}})
			wantError(t, s.api(fresh, 0).do("DELETE", "/v1/monitors/00000000-0000-4000-8000-000000000000", nil), 403,
				`{"error":"forbidden","reason":"scope"}`)
		}
	}
}

// TestTheSignedIdentityCarriesTheScopes: a service behind a gateway with identity_key
// verifies the assertion with gatewayauth and reads the key's scopes from it, and
// X-Gateway-Key-Scopes carries the same; an unscoped key's assertion has none.
func TestTheSignedIdentityCarriesTheScopes(t *testing.T) {
	_, keyFile := gatewayauthtest.NewKey(t)
	s := newStackWith(t, stackOptions{identityKey: keyFile})
	org, owner := s.newOwner("pro")
	_, scoped := owner.createKeyWith(org.ID, "scoped", "Editor", map[string]any{"scopes": []string{"monitors:read", "monitors:write"}})
	_, unscoped := owner.createKey(org.ID, "unscoped", "Editor", nil)

	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: s.URL(0) + "/.well-known/jwks.json"})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []gatewayauth.Identity
	var headers []string
	service := httptest.NewUnstartedServer(v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := gatewayauth.FromContext(r.Context())
		mu.Lock()
		seen, headers = append(seen, id), append(headers, r.Header.Get("X-Gateway-Key-Scopes"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"data":[],"next_cursor":null}`))
	})))
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	service.Listener = l
	service.Start()
	t.Cleanup(service.Close)
	s.upAddr = l.Addr().String() // the gateway started next proxies /v1 to the service
	s.startGateway("open")
	deadline := time.Now().Add(10 * time.Second)
	for _, key := range []string{scoped, unscoped} {
		for {
			r := s.api(key, 2).do("GET", "/v1/monitors", nil)
			if r.Status == http.StatusOK {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("through the service: %d %s", r.Status, r.Body)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 {
		t.Fatalf("the service saw %d identities", len(seen))
	}
	if id := seen[0]; id.Scope != "monitors:read monitors:write" || !id.HasScope("monitors:write") || id.HasScope("monitors:delete") ||
		id.Role != "Editor" || id.OrgID != org.ID || headers[0] != "monitors:read monitors:write" {
		t.Errorf("scoped key: identity %+v, X-Gateway-Key-Scopes %q", id, headers[0])
	}
	if id := seen[1]; id.Scope != "" || !id.HasScope("monitors:delete") || headers[1] != "" {
		t.Errorf("unscoped key: identity %+v, X-Gateway-Key-Scopes %q", id, headers[1])
	}
}
