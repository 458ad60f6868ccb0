package caddymodule

import (
	"net/http"
	"unicode/utf8"

	"github.com/keygate/keygate/keystore"
)

// writeMe answers GET /v1/me: {"org_id":"…","role":"…"}.
func writeMe(w http.ResponseWriter, key keystore.Key) {
	b := make([]byte, 0, 96)
	b = append(b, `{"org_id":`...)
	b = appendJSONString(b, key.OrgID)
	b = append(b, `,"role":`...)
	b = appendJSONString(b, string(key.Role))
	b = append(b, '}')
	writeJSON(w, http.StatusOK, b)
}

// appendJSONString appends s as a JSON string. It escapes what JSON requires, and
// the characters HTML-sensitive decoders care about. The values it writes, UUIDs
// and roles, never need it. But the output stays valid whatever the database holds.
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
