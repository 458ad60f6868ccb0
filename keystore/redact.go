package keystore

import (
	"regexp"
	"strings"
)

// keyShaped matches an API key of any prefix: the part up to its keyId is kept, the
// secret is not. Any case: a key sent as a header name may be logged lower-cased.
var keyShaped = regexp.MustCompile(`(?i)(_live_[a-z0-9]{16,64})\.[a-z0-9_-]+`)

// Redact replaces the secret of every key-shaped string in s, of any prefix, by
// REDACTED (<prefix>_live_<keyId>.REDACTED), for logs. A key may be percent-encoded
// in part or whole (mon%5Flive%5F…%2E…, even twice): when the decoded s holds a key,
// the decoded s is what is redacted and returned.
func Redact(s string) string {
	decoded := s
	for range 3 {
		d := PercentDecode(decoded)
		if d == decoded {
			break
		}
		decoded = d
	}
	if decoded != s && keyShaped.MatchString(decoded) {
		s = decoded
	}
	if !containsFold(s, "_live_") {
		return s
	}
	return keyShaped.ReplaceAllString(s, "${1}.REDACTED")
}

// containsFold reports whether s contains substr (lower case ASCII) in any case.
func containsFold(s, substr string) bool {
	for i := 0; i+len(substr) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(substr)], substr) {
			return true
		}
	}
	return false
}

// PercentDecode decodes every valid %XX in s and leaves anything else as it is, where
// url.PathUnescape would refuse s whole. Redact decodes keys with it, and the
// gateway's log filter the passwords of URLs.
func PercentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]) {
			b.WriteByte(unhex(s[i+1])<<4 | unhex(s[i+2]))
			i += 2
			continue
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}
