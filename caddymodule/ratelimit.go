package caddymodule

import (
	"net/http"
	"strconv"

	"github.com/keygate/keygate/limiter"
)

// The RateLimit header fields of draft-ietf-httpapi-ratelimit-headers-11 (CONTRACT §5)
// and the 429 of a key over its budget.

// writeRateLimited writes the 429 of a key over its budget: Retry-After and
// retryAfter both carry the seconds left in the window.
func writeRateLimited(w http.ResponseWriter, res limiter.Result) {
	var buf [64]byte
	b := append(buf[:0], `{"error":"rate_limited","retryAfter":`...)
	b = strconv.AppendInt(b, int64(res.ResetAfter), 10)
	b = append(b, '}')
	w.Header()["Retry-After"] = []string{strconv.Itoa(res.ResetAfter)}
	writeJSON(w, http.StatusTooManyRequests, b)
}

// setRateLimitHeaders sets the header fields of draft-ietf-httpapi-ratelimit-headers-11
// for a counted request (CONTRACT §5). Set, not Add: an upstream cannot add its own.
func setRateLimitHeaders(hdr http.Header, res limiter.Result) {
	// Both values are built in one buffer and become one string, and their slices
	// share one backing array (each capped at its value, see writeJSON).
	var buf [96]byte
	b := append(buf[:0], `"default";q=`...)
	b = strconv.AppendInt(b, int64(res.Limit), 10)
	b = append(b, ";w=60"...)
	split := len(b)
	b = append(b, `"default";r=`...)
	b = strconv.AppendInt(b, int64(max(res.Remaining, 0)), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, int64(res.ResetAfter), 10)
	both := string(b)
	v := []string{both[:split], both[split:]}
	hdr["Ratelimit-Policy"], hdr["Ratelimit"] = v[0:1:1], v[1:2:2]
}

// rateLimitHeaders makes hdr carry the count of rl and nothing else: the fields of
// the count when the request was counted, none when rl is nil (an unlimited key, or
// a limiter that could not count), whatever an upstream set. Only the gateway counts.
func rateLimitHeaders(hdr http.Header, rl *limiter.Result) {
	if rl != nil {
		setRateLimitHeaders(hdr, *rl)
		return
	}
	delete(hdr, "Ratelimit")
	delete(hdr, "Ratelimit-Policy")
}

// writeCounted sets the RateLimit fields of a counted request (rl not nil) on an
// answer of the module's own.
func writeCounted(w http.ResponseWriter, rl *limiter.Result) {
	if rl != nil {
		setRateLimitHeaders(w.Header(), *rl)
	}
}
