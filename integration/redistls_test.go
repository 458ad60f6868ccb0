package integration

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// TestGatewayOnTLSRedisNeedsTheRightCA runs gateways on the stack's TLS-only Redis
// (rediss://). With a redis_tls_ca that did not sign the server's certificate nothing
// can be counted: limiter_failure closed answers 503 service_unavailable, open lets the
// request through without RateLimit headers, and the log says that the certificate
// could not be verified. A third gateway given the right CA counts.
func TestGatewayOnTLSRedisNeedsTheRightCA(t *testing.T) {
	tlsURL := testenv.Getenv(t, "REDIS_TLS_URL")
	ca, wrongCA := testenv.Getenv(t, "REDIS_TLS_CA"), testenv.Getenv(t, "REDIS_TLS_WRONG_CA")
	s := newStackWith(t, stackOptions{redisURL: tlsURL, redisTLSCA: wrongCA})
	_, key := s.newKey("pro", "Admin")

	for range 3 {
		r := s.api(key, 1).do("GET", "/v1/me", nil)
		wantError(t, r, 503, serviceUnavailable)
		if h := r.Header.Get("WWW-Authenticate"); h != "" {
			t.Errorf("the 503 of an unverified Redis carries WWW-Authenticate %q", h)
		}
		if r := s.api(key, 0).do("GET", "/v1/me", nil); r.Status != 200 || r.Header.Get("RateLimit") != "" {
			t.Errorf("limiter_failure open on an unverified Redis: %d %s, RateLimit %q; want 200 without RateLimit",
				r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}
	// Each gateway says so once, at start, in its own log (beside go-redis's dial
	// errors on stderr), and again with every sampled limiter failure.
	for _, g := range s.gateways {
		start := moduleLogLines(t, g.proc.logs(), "redis did not answer at start; limiter_failure applies until it does")
		if len(start) != 1 || start[0]["error"] != "tls: failed to verify certificate: x509: certificate signed by unknown authority" ||
			start[0]["level"] != "warn" || start[0]["addr"] != strings.TrimSuffix(strings.TrimPrefix(tlsURL, "rediss://"), "/0") {
			t.Errorf("%s logged %v at start; want one warning naming the Redis and its unverified certificate", g.proc.name, start)
		}
		failed := moduleLogLines(t, g.proc.logs(), "rate limiter failed; ")
		if len(failed) == 0 || !strings.HasSuffix(failed[0]["error"].(string), "tls: failed to verify certificate: x509: certificate signed by unknown authority") {
			t.Errorf("%s logged %v for the failed counts; want the certificate error", g.proc.name, failed)
		}
	}

	s.redisTLSCA = ca
	s.startGateway("closed")
	var left []int
	for range 2 {
		r := s.api(key, 2).do("GET", "/v1/me", nil)
		m := rateLimitRE.FindStringSubmatch(r.Header.Get("RateLimit"))
		if r.Status != 200 || m == nil {
			t.Fatalf("with the right CA: %d %s, RateLimit %q; want 200 and a count", r.Status, r.Body, r.Header.Get("RateLimit"))
		}
		n, _ := strconv.Atoi(m[1])
		left = append(left, n)
	}
	if left[1] != left[0]-1 {
		t.Errorf("with the right CA, two requests left %v in the window: not counted one each", left)
	}
}

// moduleLogLines returns the JSON log lines of the v1_gateway module whose message
// begins with msg.
func moduleLogLines(t *testing.T, logs, msg string) []map[string]any {
	t.Helper()
	var found []map[string]any
	for line := range strings.SplitSeq(logs, "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) != nil {
			continue // go-redis's own logger writes plain text to stderr
		}
		if m, _ := entry["msg"].(string); entry["logger"] == "http.handlers.v1_gateway" && strings.HasPrefix(m, msg) {
			found = append(found, entry)
		}
	}
	return found
}
