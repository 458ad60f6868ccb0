package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

const serviceUnavailable = `{"error":"service_unavailable"}`

// timed runs f and fails the test if it took longer than limit: no answer may hang.
func timed(t *testing.T, limit time.Duration, f func() Resp) Resp {
	t.Helper()
	start := time.Now()
	r := f()
	if d := time.Since(start); d > limit {
		t.Errorf("the answer took %v, more than %v", d, limit)
	}
	return r
}

func TestRedisDownOpenAndClosedAndBack(t *testing.T) {
	s := newStack(t)
	_, key := s.newKey("pro", "Admin")
	open, closed := s.api(key, 0), s.api(key, 1)
	for _, a := range []*api{open, closed} {
		if r := a.do("GET", "/v1/me", nil); r.Status != 200 || r.Header.Get("RateLimit") == "" {
			t.Fatalf("before: %d %s RateLimit %q", r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}

	s.stackCmd("stop-redis")
	restarted := false
	defer func() {
		if !restarted {
			s.stackCmd("start-redis")
		}
	}()
	for range 3 {
		r := timed(t, 2*time.Second, func() Resp { return open.do("GET", "/v1/me", nil) })
		if r.Status != 200 {
			t.Errorf("limiter_failure open with Redis down: %d %s, want 200", r.Status, r.Body)
		}
		if r.Header.Get("RateLimit") != "" {
			t.Errorf("limiter_failure open with Redis down still claims a count: %q", r.Header.Get("RateLimit"))
		}
		if r := timed(t, 2*time.Second, func() Resp { return open.do("GET", "/v1/monitors", nil) }); r.Status != 200 {
			t.Errorf("proxied with Redis down (open): %d %s", r.Status, r.Body)
		}
		wantError(t, timed(t, 2*time.Second, func() Resp { return closed.do("GET", "/v1/me", nil) }), 503, serviceUnavailable)
	}
	// Credentials are still checked first while Redis is down.
	wantError(t, s.api("mon_live_nope", 0).do("GET", "/v1/me", nil), 401, unauthenticated)

	s.stackCmd("start-redis")
	restarted = true
	for _, a := range []*api{open, closed} {
		testenv.Eventually(t, 10*time.Second, "counting again after Redis came back", func() bool {
			r := a.do("GET", "/v1/me", nil)
			return r.Status == 200 && rateLimitRE.MatchString(r.Header.Get("RateLimit"))
		})
	}
}

func TestPostgresDownAnswers503AndRecoversWithoutRestartingCaddy(t *testing.T) {
	s := newStack(t)
	_, key := s.newKey("pro", "Admin")
	a := s.api(key, 0)
	if r := a.do("GET", "/v1/me", nil); r.Status != 200 {
		t.Fatalf("before: %d %s", r.Status, r.Body)
	}

	s.stackCmd("stop-pg")
	restarted := false
	defer func() {
		if !restarted {
			s.stackCmd("start-pg")
		}
	}()
	for _, i := range []int{0, 1} {
		for _, path := range []string{"/v1/me", "/v1/monitors"} {
			r := timed(t, 5*time.Second, func() Resp { return s.api(key, i).do("GET", path, nil) })
			wantError(t, r, 503, serviceUnavailable)
			if r.Header.Get("WWW-Authenticate") != "" {
				t.Errorf("a 503 for a dead database carries WWW-Authenticate: it must not look like a bad key")
			}
		}
	}
	// A malformed key needs no database: still the plain 401.
	wantError(t, s.api("garbage", 0).do("GET", "/v1/me", nil), 401, unauthenticated)

	s.stackCmd("start-pg")
	restarted = true
	for _, i := range []int{0, 1} {
		testenv.Eventually(t, 15*time.Second, "gateway answering again after PostgreSQL came back", func() bool {
			return s.api(key, i).do("GET", "/v1/me", nil).Status == 200
		})
	}
	testenv.Eventually(t, 15*time.Second, "upstream answering again after PostgreSQL came back", func() bool {
		return a.do("GET", "/v1/monitors", nil).Status == 200
	})
	// And it stays up.
	for range 10 {
		if r := a.do("GET", "/v1/monitors", nil); r.Status != 200 {
			t.Fatalf("after recovery: %d %s", r.Status, r.Body)
		}
	}
}

func TestUpstreamDownAnswers502JSON(t *testing.T) {
	s := newStack(t)
	_, key := s.newKey("pro", "Admin")
	a := s.api(key, 0)

	s.stopUpstream()
	for _, rq := range []struct{ method, path string }{{"GET", "/v1/monitors"}, {"POST", "/v1/monitors"}} {
		r := timed(t, 5*time.Second, func() Resp { return a.do(rq.method, rq.path, newMonitor("x")) })
		if r.Status != http.StatusBadGateway && r.Status != http.StatusGatewayTimeout {
			t.Errorf("%s %s with the upstream down: %d %s, want 502 or 504", rq.method, rq.path, r.Status, r.Body)
		}
		if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/json") {
			t.Errorf("Content-Type %q", r.Header.Get("Content-Type"))
		}
		if e, ok := r.JSON(t)["error"].(string); !ok || e == "" {
			t.Errorf("body %s has no string error", r.Body)
		}
		if !rateLimitRE.MatchString(r.Header.Get("RateLimit")) {
			t.Errorf("the 502 of a limited key lacks RateLimit: %q", r.Header.Get("RateLimit"))
		}
	}
	// /v1/me needs no upstream.
	if r := a.do("GET", "/v1/me", nil); r.Status != 200 {
		t.Errorf("/v1/me with the upstream down: %d %s", r.Status, r.Body)
	}

	s.startUpstream()
	if r := a.do("GET", "/v1/monitors", nil); r.Status != 200 {
		t.Errorf("after the upstream came back: %d %s", r.Status, r.Body)
	}
}

// TestLogsNeverShowKeysOrSessions drives requests that put keys and session tokens in
// every place a client might (header, query, cookie, body) and checks every process's
// log. (Every test also checks its logs when it ends; this one makes sure there are logs
// to check.)
func TestLogsNeverShowKeysOrSessions(t *testing.T) {
	s := newStack(t)
	org, owner := s.newOwner("pro")
	id, key := owner.createKey(org.ID, "k", "Admin", nil)
	session := owner.sessionCookie()
	_, secret, _ := strings.Cut(key, ".")

	s.api(key, 0).do("GET", "/v1/me", nil)
	s.api(key, 1).do("POST", "/v1/monitors", newMonitor("m"))
	s.api(key, 0).do("GET", "/v1/nope", nil)
	s.raw("GET", s.URL(0)+"/v1/me?api_key="+key, nil, nil)
	s.raw("GET", s.URL(0)+"/v1/me", nil, http.Header{"Cookie": {"session=" + session}})
	s.raw("GET", s.URL(0)+"/v1/me", nil, http.Header{"Authorization": {"Bearer mon_live_" + id + ".wrong" + secret[5:]}})
	owner.do("GET", "/orgs/"+org.ID+"/api-keys", nil, nil)
	owner.do("POST", "/auth/logout", nil, nil)
	wantError(t, owner.do("GET", "/orgs/"+org.ID+"/api-keys", nil, nil), 401, `{"error":"unauthenticated"}`)

	for _, p := range s.procs[1:3] { // the two gateways
		if !strings.Contains(p.logs(), `"uri":"/v1/`) {
			t.Errorf("%s logged no request: the access log is off, so this test proves nothing", p.name)
		}
	}
	if !strings.Contains(s.upstream.logs(), "/orgs/") {
		t.Errorf("the upstream logged no request")
	}
	// checkLogs runs at cleanup with every key, secret, password and session token.
}
