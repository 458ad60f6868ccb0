package caddymodule

import (
	"net/http"
	"strconv"

	"github.com/keygate/keygate/limiter"
)

// The error bodies of the /v1 contract (README.md, the decision order). Every /v1
// error is application/json with a string field "error", whoever produced it.
var (
	bodyUnauthenticated    = []byte(`{"error":"api key unauthenticated"}`)
	bodyFeatureGated       = []byte(`{"error":"feature_gated","feature":"api","upgrade":true}`)
	bodyForbidden          = []byte(`{"error":"forbidden","reason":"role","required_role":"Editor"}`) // the least role that writes
	bodyScopeForbidden     = []byte(`{"error":"forbidden","reason":"scope"}`)
	bodyServiceUnavailable = []byte(`{"error":"service_unavailable"}`)
	bodyBadGateway         = []byte(`{"error":"bad_gateway"}`)
	bodyGatewayTimeout     = []byte(`{"error":"gateway_timeout"}`)
	bodyRequestTooLarge    = []byte(`{"error":"request_too_large"}`) // the upstream's own name for 413
)

// writeJSON writes a complete JSON response the module produced itself. Shared
// caches never keep it (Cache-Control: no-store): it depends on the caller's key.
// Browsers never sniff it (X-Content-Type-Options: nosniff). A browser sent one from
// a page of another origin must not take it for HTML or script, whatever its bytes.
//
// The header values share one backing array. Each slice is capped at its one value,
// so appending to it (Header.Add) copies it rather than overwrite its neighbour. The
// names are canonical, so nothing is canonicalized on the way.
func writeJSON(w http.ResponseWriter, status int, body []byte) {
	v := make([]string, jsonHeaders)
	setJSONHeaders(w.Header(), v, len(body))
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

// scopeForbiddenBody is the body of the 403 of a scoped key: with required_scope, the
// scope its route needs, or without it on a route no rule names.
func scopeForbiddenBody(required string) []byte {
	if required == "" {
		return bodyScopeForbidden
	}
	b := make([]byte, 0, len(bodyScopeForbidden)+len(required)+20)
	b = append(b, bodyScopeForbidden[:len(bodyScopeForbidden)-1]...)
	b = append(b, `,"required_scope":`...)
	b = appendJSONString(b, required)
	return append(b, '}')
}

// quotaExceededBody is the body of the 402 of a request over its organisation's
// monthly quota m: with the month's limit and what it has used, in units.
func quotaExceededBody(m limiter.Quota) []byte {
	b := make([]byte, 0, 112)
	b = append(b, `{"error":"quota_exceeded","metric":"api_requests","upgrade":true,"limit":`...)
	b = strconv.AppendInt(b, m.Limit, 10)
	b = append(b, `,"used":`...)
	b = strconv.AppendInt(b, m.Used, 10)
	return append(b, '}')
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

// writeUnauthenticated writes the one 401, with status (Handler.refuse gives the
// outcome's). Every credential failure goes through here and nowhere else: absent,
// malformed, unknown, revoked, expired, wrong secret, outside the key's networks. So
// nothing in the status, headers or body tells them apart. It is called before any
// RateLimit field is set.
func writeUnauthenticated(w http.ResponseWriter, status int) {
	v := make([]string, jsonHeaders+1)
	hdr := w.Header()
	setJSONHeaders(hdr, v, len(bodyUnauthenticated))
	v[jsonHeaders] = "Bearer"
	hdr["Www-Authenticate"] = v[jsonHeaders : jsonHeaders+1 : jsonHeaders+1]
	w.WriteHeader(status)
	_, _ = w.Write(bodyUnauthenticated)
}

// statusBody returns the JSON error body of a status the module did not choose: an
// upstream failure, or an upstream error in another format. It is
// {"error":"<status text in snake_case>"}, for example {"error":"bad_gateway"}.
func statusBody(status int) []byte {
	switch status {
	case http.StatusBadGateway:
		return bodyBadGateway
	case http.StatusGatewayTimeout:
		return bodyGatewayTimeout
	case http.StatusServiceUnavailable:
		return bodyServiceUnavailable
	case http.StatusRequestEntityTooLarge:
		return bodyRequestTooLarge
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

// appendSnake appends text in lower snake_case. Letters and digits are kept and
// lowercased. Every run of anything else is one underscore ("I'm a teapot" →
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
