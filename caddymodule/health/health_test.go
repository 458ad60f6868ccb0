package health

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/internal/testkit/testenv"
)

// get asks the handler for the health with method, and returns the status and body.
func get(t *testing.T, method string) (int, string) {
	t.Helper()
	w := httptest.NewRecorder()
	if err := (Health{}).ServeHTTP(w, httptest.NewRequest(method, "/healthz", nil), nil); err != nil {
		t.Fatal(err)
	}
	if ct, cc := w.Header().Get("Content-Type"), w.Header().Get("Cache-Control"); ct != "application/json" || cc != "no-store" {
		t.Errorf("Content-Type %q, Cache-Control %q; want application/json, no-store", ct, cc)
	}
	return w.Code, w.Body.String()
}

// TestHealthAnswersWhatTheBreakersKnow holds the three answers, with breakers of
// the process watched as v1_gateway watches its own (the harness of caddymodule and
// the integration suite show it with real servers).
func TestHealthAnswersWhatTheBreakersKnow(t *testing.T) {
	if code, body := get(t, http.MethodGet); code != http.StatusServiceUnavailable || body != `{"status":"unavailable","down":[],"reason":"no_gateway"}` {
		t.Errorf("with no v1_gateway loaded: %d %s", code, body)
	}

	redisUp := make(chan bool, 10)
	pg := conns.NewBreaker(nil, nil) // a probe of nil answers at once
	rd := conns.NewBreaker(func() bool { return <-redisUp }, nil)
	defer conns.Watch("postgres", "pg", pg)()
	defer conns.Watch("redis", "rd", rd)()
	redisUp <- true
	testenv.Eventually(t, 10*time.Second, "200 once both answered their first ping", func() bool {
		code, body := get(t, http.MethodGet)
		return code == http.StatusOK && body == `{"status":"ok"}`
	})

	for range conns.BreakerThreshold { // Redis fails calls: its breaker opens
		if rd.Allow() {
			rd.Done(conns.CallFailed)
		}
	}
	code, body := get(t, http.MethodGet)
	if code != http.StatusServiceUnavailable || body != `{"status":"unavailable","down":["redis"]}` {
		t.Errorf("with Redis's breaker open: %d %s", code, body)
	}
	if code, body := get(t, http.MethodHead); code != http.StatusServiceUnavailable || body != "" {
		t.Errorf("HEAD: %d %q, want 503 and no body", code, body)
	}
	// No request comes: a health check a cooldown on starts the probe that closes it.
	redisUp <- true
	testenv.Eventually(t, 10*time.Second, "200 once Redis's probe answered", func() bool {
		code, _ := get(t, http.MethodGet)
		return code == http.StatusOK
	})
}

func TestHealthCaddyfileTakesNothing(t *testing.T) {
	for _, tc := range []struct {
		input, err string
	}{
		{"keygate_health", ""},
		{"keygate_health /healthz", "wrong argument count"},
		{"keygate_health {\n\tverbose\n}", "keygate_health takes no block"},
	} {
		err := Health{}.UnmarshalCaddyfile(caddyfile.NewTestDispenser(tc.input))
		if (err == nil) != (tc.err == "") || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %v, want %q", tc.input, err, tc.err)
		}
	}
}
