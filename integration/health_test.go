package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// TestHealthFollowsPostgresAndRedis: keygate_health answers 200 while PostgreSQL and
// Redis answer, 503 naming the one that is stopped, and 200 again once it is back.
// No request goes to /v1 meanwhile: the health checks alone find each change.
func TestHealthFollowsPostgresAndRedis(t *testing.T) {
	s := newStack(t)
	health := func(i int) Resp { return s.raw("GET", s.URL(i)+"/healthz", nil, nil) }
	want := func(what, body string) {
		t.Helper()
		for i := range s.gateways {
			var last Resp
			testenv.Eventually(t, 30*time.Second, fmt.Sprintf("gateway %d: %s", i, what), func() bool {
				last = health(i)
				return string(last.Body) == body
			})
			wantStatus := 200
			if body != `{"status":"ok"}` {
				wantStatus = 503
			}
			if last.Status != wantStatus || last.Header.Get("Content-Type") != "application/json" {
				t.Errorf("gateway %d: %s: %d %q %s", i, what, last.Status, last.Header.Get("Content-Type"), last.Body)
			}
		}
	}
	want("both up", `{"status":"ok"}`)
	for _, dep := range []struct{ name, stop, start string }{
		{"postgres", "stop-pg", "start-pg"},
		{"redis", "stop-redis", "start-redis"},
	} {
		s.stackCmd(dep.stop)
		started := false
		defer func() {
			if !started {
				s.stackCmd(dep.start)
			}
		}()
		want(dep.name+" stopped", `{"status":"unavailable","down":["`+dep.name+`"]}`)
		s.stackCmd(dep.start)
		started = true
		want(dep.name+" back", `{"status":"ok"}`)
	}
}
