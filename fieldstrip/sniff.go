package fieldstrip

import "strings"

// This file holds the JSON filter's sniffing mode, for a body whose Content-Type does
// not say JSON. Such a body may be JSON all the same, and then its fields are
// stripped. So the filter reads it as JSON and decides at the first byte that is not
// whitespace or a UTF-8 BOM. A body that starts with { or [ is filtered. Any other
// body passes through untouched.
//
// A body that starts as JSON may stop being JSON further on. So the filter holds the
// body back until it knows. It keeps the input as it came and the filtered output.
// At the end, the filtered output goes out if the body was JSON throughout, and the
// input if not. Past holdLimit bytes, the body is taken for the JSON it has been so
// far and streams.

// holdLimit bounds the body a sniffing filter holds back.
const holdLimit = 1 << 20

// sniffing is the state of the sniffing mode, embedded in a Filter.
type sniffing struct {
	sniff       bool // the first value is still to come: decide whether the body is JSON
	passthrough bool // not JSON: the rest passes through untouched
	hold        bool // the body is held back until it is known to be JSON
	orig, held  []byte
}

// passRest ends sniffing with the body not JSON: rest, the rest of this Write, is
// copied untouched, and so is every later Write.
func (f *Filter) passRest(rest []byte) {
	f.passthrough = true
	f.out = append(f.out, rest...)
}

// writeHeld handles one Write while the body is held back.
func (f *Filter) writeHeld(p []byte) (int, error) {
	f.orig = append(f.orig, p...)
	f.out = f.out[:0]
	f.scan(p)
	f.held = append(f.held, f.out...)
	switch {
	case f.err != nil:
		// Not JSON after all: the body goes out as it came.
		f.err, f.hold, f.passthrough = nil, false, true
		return len(p), f.flushHeld(f.orig)
	case f.passthrough:
		f.hold = false
		return len(p), f.flushHeld(f.held) // the body as it came: nothing was filtered
	case len(f.orig) > holdLimit:
		f.hold = false
		return len(p), f.flushHeld(f.held)
	}
	return len(p), nil
}

// flushHeld writes b and ends holding.
func (f *Filter) flushHeld(b []byte) error {
	_, err := f.dst.Write(b)
	f.orig, f.held = nil, nil
	if err != nil {
		f.err = err
	}
	return err
}

// closeHeld ends a stream held back to its end. The filtered output goes out if the
// body was JSON throughout; the body as it came, if not.
func (f *Filter) closeHeld() error {
	f.hold = false
	if err := f.Close(); err != nil {
		f.err = nil
		return f.flushHeld(f.orig)
	}
	return f.flushHeld(f.held)
}

// IsJSONType reports whether a Content-Type names a JSON body: application/json,
// any +json suffix (application/problem+json), and the JSON streaming types
// (application/x-ndjson, application/jsonl, application/json-seq). Any media type
// that mentions json counts: when in doubt, the body is filtered.
func IsJSONType(ct string) bool {
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
