package caddymodule

import (
	"net/http"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/keygate/keygate/limiter"
)

// The error bodies of the /v1 contract (CONTRACT §2). Every /v1 error is
// application/json with a string field "error", whoever produced it.
var (
	bodyUnauthenticated    = []byte(`{"error":"api key unauthenticated"}`)
	bodyFeatureGated       = []byte(`{"error":"feature_gated","feature":"api","upgrade":true}`)
	bodyForbidden          = []byte(`{"error":"forbidden"}`)
	bodyServiceUnavailable = []byte(`{"error":"service_unavailable"}`)
	bodyBadGateway         = []byte(`{"error":"bad_gateway"}`)
	bodyGatewayTimeout     = []byte(`{"error":"gateway_timeout"}`)
)

// writeJSON writes a complete JSON response the module produced itself. The response
// is never cached by shared caches: it depends on the caller's key.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// writeUnauthenticated writes the one 401 of the contract. Every credential failure
// (absent, malformed, unknown, revoked, expired, wrong secret) goes through here and
// nowhere else, so that nothing in the status, headers or body tells them apart.
// It is called before any RateLimit header is set.
func writeUnauthenticated(w http.ResponseWriter) {
	w.Header().Set("WWW-Authenticate", "Bearer")
	writeJSON(w, http.StatusUnauthorized, bodyUnauthenticated)
}

// writeRateLimited writes the 429 of a key over its budget: Retry-After and
// retryAfter both carry the seconds left in the window.
func writeRateLimited(w http.ResponseWriter, res limiter.Result) {
	var buf [64]byte
	b := append(buf[:0], `{"error":"rate_limited","retryAfter":`...)
	b = strconv.AppendInt(b, int64(res.ResetAfter), 10)
	b = append(b, '}')
	w.Header().Set("Retry-After", strconv.Itoa(res.ResetAfter))
	writeJSON(w, http.StatusTooManyRequests, b)
}

// setRateLimitHeaders sets the header fields of draft-ietf-httpapi-ratelimit-headers-11
// for a counted request (CONTRACT §5). Set, not Add: an upstream cannot add its own.
func setRateLimitHeaders(hdr http.Header, res limiter.Result) {
	var buf [64]byte
	b := append(buf[:0], `"default";q=`...)
	b = strconv.AppendInt(b, int64(res.Limit), 10)
	b = append(b, ";w=60"...)
	hdr["Ratelimit-Policy"] = []string{string(b)}

	b = append(buf[:0], `"default";r=`...)
	b = strconv.AppendInt(b, int64(max(res.Remaining, 0)), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, int64(res.ResetAfter), 10)
	hdr["Ratelimit"] = []string{string(b)}
}

// statusBody returns the JSON error body for an HTTP status the module did not choose
// itself (an upstream failure, or an upstream error answered in another format):
// {"error":"<status text in snake_case>"}, for example {"error":"bad_gateway"}.
func statusBody(status int) []byte {
	switch status {
	case http.StatusBadGateway:
		return bodyBadGateway
	case http.StatusGatewayTimeout:
		return bodyGatewayTimeout
	case http.StatusServiceUnavailable:
		return bodyServiceUnavailable
	}
	text := http.StatusText(status)
	if status == 499 {
		text = "Client Closed Request" // Caddy's status for a client that went away
	}
	if text == "" {
		text = "error"
	}
	b := make([]byte, 0, len(text)+14)
	b = append(b, `{"error":"`...)
	b = appendSnake(b, text)
	return append(b, `"}`...)
}

// appendSnake appends text in lower snake_case: letters and digits kept and
// lowercased, every run of anything else one underscore ("I'm a teapot" →
// "i_m_a_teapot").
func appendSnake(b []byte, text string) []byte {
	under, started := false, false
	for i := 0; i < len(text); i++ {
		c := text[i]
		switch {
		case c >= 'A' && c <= 'Z':
			c += 'a' - 'A'
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		default:
			under = true
			continue
		}
		if under && started {
			b = append(b, '_')
		}
		under, started = false, true
		b = append(b, c)
	}
	return b
}

// appendJSONString appends s as a JSON string. It escapes what JSON requires and
// the characters HTML-sensitive decoders care about; the values it writes (UUIDs,
// roles) never need it, but the output stays valid whatever the database holds.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20 || c == '<' || c == '>' || c == '&':
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}

// isJSONType reports whether a Content-Type names a JSON body: application/json,
// any +json suffix (application/problem+json), and the JSON streaming types
// (application/x-ndjson, application/jsonl, application/json-seq). Anything whose
// media type mentions json counts: when in doubt the body is filtered.
func isJSONType(ct string) bool {
	if i := strings.IndexByte(ct, ';'); i >= 0 {
		ct = ct[:i]
	}
	for i := 0; i+4 <= len(ct); i++ {
		if (ct[i]|0x20) == 'j' && (ct[i+1]|0x20) == 's' && (ct[i+2]|0x20) == 'o' && (ct[i+3]|0x20) == 'n' {
			return true
		}
	}
	return false
}
