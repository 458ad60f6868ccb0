package fieldstrip

import (
	"unicode"
	"unicode/utf8"
)

// Fields is the set of member names a Filter removes. This file holds how a member's
// name matches one: folded as encoding/json folds names.
type Fields struct {
	names map[string]struct{}
	// keyLimit is the longest raw member name, still escaped and with its quotes,
	// that can decode to one of names. An escape takes at most 6 bytes for every
	// byte it decodes to. A longer name is kept without being buffered.
	keyLimit int
}

// NewFields returns the set of names, matched in any case (Has).
func NewFields(names []string) *Fields {
	s := &Fields{names: make(map[string]struct{}, len(names))}
	longest := 0
	for _, n := range names {
		s.names[string(foldName(nil, []byte(n)))] = struct{}{}
		longest = max(longest, len(n))
	}
	s.keyLimit = 6*longest + 2
	return s
}

// Has reports whether the decoded member name is in s. Names match in any case, as
// encoding/json matches a member to a struct field: "Config" and "CONFIG" are config
// to a Go client. Has does not allocate for names of up to 64 bytes.
func (s *Fields) Has(name []byte) bool {
	var buf [64]byte
	_, ok := s.names[string(foldName(buf[:0], name))]
	return ok
}

// foldName appends in to out, case-folded as encoding/json folds names (its
// appendFoldedName). ASCII letters go to upper case. Any other rune goes to the
// smallest rune of its Unicode fold set. So foldName(x) == foldName(y) exactly when
// bytes.EqualFold(x, y): "ſ" is "S", and "K" (Kelvin) is "K".
func foldName(out, in []byte) []byte {
	for i := 0; i < len(in); {
		if c := in[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(in[i:])
		out = utf8.AppendRune(out, foldRune(r))
		i += n
	}
	return out
}

// foldRune returns the smallest rune of r's fold set.
func foldRune(r rune) rune {
	for {
		r2 := unicode.SimpleFold(r)
		if r2 <= r {
			return r2
		}
		r = r2
	}
}
