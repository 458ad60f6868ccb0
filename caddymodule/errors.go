package caddymodule

import (
	"net/http"
	"strconv"
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
// is never cached by shared caches: it depends on the caller's key. Nor is it sniffed
// (X-Content-Type-Options: nosniff): a browser that is sent one, from a page of
// another origin, must not take it for HTML or script whatever its bytes.
//
// The header values share one backing array, each slice capped at its one value so
// that appending to it (Header.Add) copies it rather than overwrite its neighbour; the
// names are canonical, so that nothing is canonicalized on the way.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	v := make([]string, jsonHeaders)
	setJSONHeaders(w.Header(), v, len(body))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// jsonHeaders is how many values setJSONHeaders sets.
const jsonHeaders = 4

// setJSONHeaders sets the header fields of writeJSON, with their values in
// v[:jsonHeaders].
func setJSONHeaders(hdr http.Header, v []string, length int) {
	v[0], v[1], v[2], v[3] = "application/json", strconv.Itoa(length), "no-store", "nosniff"
	hdr["Content-Type"], hdr["Content-Length"], hdr["Cache-Control"] = v[0:1:1], v[1:2:2], v[2:3:3]
	hdr["X-Content-Type-Options"] = v[3:4:4]
}

// writeUnauthenticated writes the one 401 of the contract. Every credential failure
// (absent, malformed, unknown, revoked, expired, wrong secret) goes through here and
// nowhere else, so that nothing in the status, headers or body tells them apart.
// It is called before any RateLimit header is set.
func writeUnauthenticated(w http.ResponseWriter) {
	v := make([]string, jsonHeaders+1)
	hdr := w.Header()
	setJSONHeaders(hdr, v, len(bodyUnauthenticated))
	v[jsonHeaders] = "Bearer"
	hdr["Www-Authenticate"] = v[jsonHeaders : jsonHeaders+1 : jsonHeaders+1]
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write(bodyUnauthenticated)
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
