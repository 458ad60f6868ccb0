package integration

import (
	"net/http"
	"net/url"
	"sync"
	"testing"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// throughPgBouncer returns the URL of the database of direct through the PgBouncer of
// bouncer, with pgx's default_query_exec_mode set to mode.
func throughPgBouncer(t *testing.T, direct, bouncer, mode string) string {
	t.Helper()
	d, err := url.Parse(direct)
	if err != nil {
		t.Fatal(err)
	}
	b, err := url.Parse(bouncer)
	if err != nil {
		t.Fatal(err)
	}
	b.Path = d.Path // PgBouncer's [databases] * passes any database name on
	q := b.Query()
	q.Set("default_query_exec_mode", mode)
	b.RawQuery = q.Encode()
	return b.String()
}

// TestKeysAndMonitorsThroughPgBouncer runs the upstream, both gateways and the operator
// CLI on PgBouncer in transaction pooling (only the migrations go to PostgreSQL
// directly), in each query mode docs/operations.md names for it: logins and the login throttle,
// a key created, used and revoked (401 on the very next request, on both gateways),
// monitors created, read, changed and deleted through /v1, with concurrent requests
// so that key lookups batch and connections are shared.
func TestKeysAndMonitorsThroughPgBouncer(t *testing.T) {
	bouncer := testenv.Getenv(t, "PGBOUNCER_DATABASE_URL")
	for _, mode := range []string{"exec", "simple_protocol"} {
		t.Run(mode, func(t *testing.T) {
			s := newStackWith(t, stackOptions{databaseVia: func(direct string) string {
				return throughPgBouncer(t, direct, bouncer, mode)
			}})
			keysAndMonitorsScenario(t, s)
		})
	}
}

func keysAndMonitorsScenario(t *testing.T, s *Stack) {
	org, owner := s.newOwner("pro")

	// The login throttle (a transaction under pg_advisory_xact_lock): five wrong
	// passwords are 401, the sixth is refused before any check.
	for i := range 6 {
		r := s.raw("POST", s.URL(0)+"/auth/login", map[string]string{"email": org.Email, "password": "wrong"}, nil)
		if i < 5 {
			wantError(t, r, 401, `{"error":"invalid credentials"}`)
		} else if r.Status != http.StatusTooManyRequests || r.JSON(t)["error"] != "rate_limited" || r.Header.Get("Retry-After") == "" {
			t.Errorf("sixth wrong password: %d %s Retry-After %q; want 429 rate_limited", r.Status, r.Body, r.Header.Get("Retry-After"))
		}
	}

	id, key := owner.createKey(org.ID, "through pgbouncer", "Editor", nil)
	want := proMe(org.ID, "Editor")
	for i := range 2 {
		if r := s.api(key, i).do("GET", "/v1/me", nil); r.Status != 200 || !jsonEqual(r.Body, []byte(want)) ||
			!rateLimitRE.MatchString(r.Header.Get("RateLimit")) {
			t.Fatalf("gateway %d GET /v1/me: %d %s RateLimit %q", i, r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}

	a := s.api(key, 0)
	created := a.do("POST", "/v1/monitors", newMonitor("homepage"))
	if created.Status != http.StatusCreated {
		t.Fatalf("create monitor: %d %s", created.Status, created.Body)
	}
	wantNoHiddenFields(t, created)
	mid := created.JSON(t)["id"].(string)
	if r := a.do("PATCH", "/v1/monitors/"+mid, map[string]any{"name": "renamed", "paused": true}); r.Status != 200 ||
		r.JSON(t)["name"] != "renamed" || r.JSON(t)["paused"] != true {
		t.Errorf("patch monitor: %d %s", r.Status, r.Body)
	}

	// Concurrent reads on both gateways: lookups batch, pooled connections interleave.
	var wg sync.WaitGroup
	statuses := make([]int, 32)
	for i := range statuses {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := "/v1/monitors/" + mid
			if i%2 == 1 {
				path = "/v1/monitors"
			}
			statuses[i] = s.api(key, i%2).do("GET", path, nil).Status
		}()
	}
	wg.Wait()
	for i, st := range statuses {
		if st != 200 {
			t.Errorf("concurrent read %d: %d, want 200", i, st)
		}
	}
	if r := a.do("GET", "/v1/monitors/"+mid, nil); r.Status != 200 || r.JSON(t)["name"] != "renamed" {
		t.Errorf("read monitor: %d %s", r.Status, r.Body)
	}
	if r := a.do("DELETE", "/v1/monitors/"+mid, nil); r.Status != http.StatusNoContent {
		t.Fatalf("delete monitor: %d %s", r.Status, r.Body)
	}
	wantError(t, a.do("GET", "/v1/monitors/"+mid, nil), 404, monitorNotFound)
	if l := a.do("GET", "/v1/monitors", nil).JSON(t); len(l["data"].([]any)) != 0 {
		t.Errorf("list after delete: %v", l)
	}

	// Revoke: the very next request, on either gateway, is refused.
	if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+id, nil, nil); r.Status != http.StatusNoContent {
		t.Fatalf("revoke: %d %s", r.Status, r.Body)
	}
	wantError(t, s.api(key, 1).do("GET", "/v1/me", nil), 401, unauthenticated)
	wantError(t, s.api(key, 0).do("GET", "/v1/monitors", nil), 401, unauthenticated)
}
