package caddymodule

import (
	"net/http"

	"github.com/keygate/keygate/keystore"
)

// bearerKey returns the key id and secret of the API key a request presents: step 1
// of ServeHTTP. A request presents a key in exactly one Authorization header whose
// value parseAuthorization accepts. Nothing else authenticates: not a cookie, not a
// query parameter, not Basic auth. ok is false for every other request, which gets
// the one 401. The key is parsed here once, and the Verifier gets its parts.
func bearerKey(hdr http.Header, f keystore.Format) (keyID, secret string, ok bool) {
	// net/http (HTTP/1, HTTP/2 and Caddy's HTTP/3) canonicalizes header names. So
	// every Authorization field a client sent is under this one key.
	vals := hdr["Authorization"]
	if len(vals) != 1 {
		return "", "", false
	}
	_, keyID, secret, ok = parseAuthorization(vals[0], f)
	return keyID, secret, ok
}

// parseAuthorization parses one Authorization header value. That is the scheme
// "Bearer" in any letter case, one or more spaces (0x20, not tabs), then the key.
// The key must be exactly <key_prefix>_live_<keyId>.<secret> as f.Parse accepts it,
// with nothing before or after it. parseAuthorization returns the key and f.Parse's
// parts of it, all sharing v's memory. It does not allocate.
//
// net/http has already removed the optional whitespace around the whole value. So
// "Bearer <key> " reaches here as "Bearer <key>".
func parseAuthorization(v string, f keystore.Format) (key, keyID, secret string, ok bool) {
	const scheme = "bearer"
	if len(v) <= len(scheme) || !asciiEqualFold(v[:len(scheme)], scheme) {
		return "", "", "", false
	}
	i := len(scheme)
	for i < len(v) && v[i] == ' ' {
		i++
	}
	if i == len(scheme) {
		return "", "", "", false // "Bearerxyz" or "Bearer\t…": no space after the scheme
	}
	key = v[i:]
	if keyID, secret, ok = f.Parse(key); !ok {
		return "", "", "", false
	}
	return key, keyID, secret, true
}

// asciiEqualFold reports whether s equals lower, a lowercase ASCII string, in any
// case of ASCII letters. Unlike strings.EqualFold, it gives non-ASCII bytes no
// special treatment: they never match.
func asciiEqualFold(s, lower string) bool {
	if len(s) != len(lower) {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != lower[i] {
			return false
		}
	}
	return true
}
