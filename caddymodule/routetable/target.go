package routetable

import (
	"net/url"
	"strings"
)

// Problems of a request's path that would let the table decide on one path while
// the upstream routes another (docs/security.md, The path decided is the path sent).
// Each is the message of the 400 that refuses it.
const (
	// PathDotSegment is a "." or ".." segment, however it is encoded. The table
	// matches the path with it removed; a service may not remove it, or may remove
	// it after decoding an encoded slash.
	PathDotSegment = "the path has a dot segment (. or ..): send the path it stands for"
	// PathEmptySegment is a doubled slash. The table merges it; a service may not.
	PathEmptySegment = "the path has an empty segment (//): send the path without it"
	// PathEncoded is an encoded slash or dot (%2F, %2E). The table reads the
	// decoded path; a service may split segments before it decodes, or after.
	PathEncoded = "the path has an encoded slash or dot (%2F, %2E): send the path without them"
	// PathBackslash is a backslash, encoded (%5C) or not, which some services read
	// as a slash.
	PathBackslash = "the path has a backslash (\\ or %5C)"
)

// CheckTarget returns what makes u's path one the table and a service could read
// differently, one of the Path* messages, or "" when there is nothing. A path it
// accepts is the same path to the table's match, which cleans, and to any service,
// which splits at "/" and decodes each segment: so the request the table weighed and
// scoped is the request the service routes, and it can be sent on as it came.
// Envoy's normalize_path, merge_slashes and path_with_escaped_slashes_action answer
// the same question; refusing, rather than rewriting, keeps the path the client sent.
func CheckTarget(u *url.URL) string {
	p := u.Path
	if strings.IndexByte(p, '\\') >= 0 {
		return PathBackslash
	}
	if u.RawPath != "" && hasEncoded(u.RawPath) {
		return PathEncoded
	}
	for i := 0; i < len(p); i++ {
		if p[i] != '/' {
			continue
		}
		seg := p[i+1:]
		if j := strings.IndexByte(seg, '/'); j >= 0 {
			seg = seg[:j]
			if j == 0 {
				return PathEmptySegment
			}
		}
		if seg == "." || seg == ".." {
			return PathDotSegment
		}
	}
	return ""
}

// hasEncoded reports whether raw, a path as the client encoded it, holds %2F or %2E
// in either case.
func hasEncoded(raw string) bool {
	for i := strings.IndexByte(raw, '%'); i >= 0 && i+2 < len(raw); {
		if raw[i+1] == '2' && (raw[i+2]|0x20 == 'f' || raw[i+2]|0x20 == 'e') {
			return true
		}
		next := strings.IndexByte(raw[i+1:], '%')
		if next < 0 {
			return false
		}
		i += 1 + next
	}
	return false
}
