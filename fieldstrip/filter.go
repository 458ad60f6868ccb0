package fieldstrip

import (
	"encoding/json"
	"io"
	"sync"
	"unicode/utf8"
)

// maxPendingSpace bounds the whitespace held back between object members while the
// filter decides whether the next member is kept. Whitespace beyond it is dropped,
// which JSON does not notice.
const maxPendingSpace = 64

// Filter is a streaming JSON filter. It is an io.Writer that copies a stream of
// JSON values to dst. It leaves out every object member whose name is in fields, at
// any depth, with the commas around it. This file holds what it does with members;
// scan.go holds its grammar.
//
// It is a hand-written tokenizer and never decodes the document. Besides the chunk
// being written, it holds at most one member name and a little whitespace. So its
// memory does not grow with the document: a 50 MB array streams through.
//
// Its grammar is encoding/json's Decoder's: any number of JSON values, one after
// another, NDJSON and concatenated JSON included. Invalid JSON is an error, from
// Write or Close, after which nothing more is written. The filter cannot tell member
// names from values in a document it cannot parse, so it stops rather than guess.
// What it wrote before the error is valid so far, with every stripped member removed.
//
// Insignificant whitespace is copied, except inside removed members and beyond
// maxPendingSpace bytes between two members.
type Filter struct {
	dst      io.Writer
	fields   *Fields
	sniffing // a body whose Content-Type does not say JSON (sniff.go)

	begun bool   // a byte other than the BOM's has been read
	bomAt uint8  // how many bytes of a leading UTF-8 BOM have been read
	out   []byte // what this Write produces, written to dst at its end
	stack []byte // open containers
	state filterState

	escaped bool  // after a backslash in a string
	hexLeft uint8 // hex digits still due in a \u escape
	num     uint8 // number state
	lit     string
	litPos  int

	key          []byte // the member name being read, raw, opening quote included
	keyUndecided bool   // key is being buffered: whether the member is kept is not known yet
	keyPlain     bool   // key holds no escape and no byte above 0x7f so far
	pendingSpace []byte // whitespace between the previous member and this one

	// skipping is true while a removed member is read. Nothing is written until the
	// value at depth skipDepth ends.
	skipping  bool
	skipDepth int
	// dropSpace is true between the end of a removed member and the next ',' or '}'.
	// The whitespace there belongs to the removed member.
	dropSpace bool

	err error
}

var filterPool = sync.Pool{New: func() any { return new(Filter) }}

// NewFilter returns a filter writing to dst, from a pool, that removes the members
// named in fields. Release it once done. With sniff, the body may not be JSON: it is
// filtered if it turns out to be, and passed through untouched if not (sniff.go).
func NewFilter(dst io.Writer, fields *Fields, sniff bool) *Filter {
	f := filterPool.Get().(*Filter)
	*f = Filter{
		dst: dst, fields: fields, sniffing: sniffing{sniff: sniff, hold: sniff},
		out: f.out[:0], stack: f.stack[:0], key: f.key[:0], pendingSpace: f.pendingSpace[:0],
	}
	return f
}

// Release returns f to the pool. f must not be used afterwards.
func (f *Filter) Release() {
	if cap(f.out) > 64<<10 {
		f.out = nil // do not keep the buffer of one huge Write forever
	}
	f.dst, f.fields = nil, nil
	filterPool.Put(f)
}

// Write filters p, a piece of the stream cut anywhere, and writes what it can
// already decide to dst.
func (f *Filter) Write(p []byte) (int, error) {
	if f.err != nil {
		return 0, f.err
	}
	if f.passthrough {
		return f.dst.Write(p)
	}
	if f.hold {
		return f.writeHeld(p)
	}
	f.out = f.out[:0]
	f.scan(p)
	if len(f.out) > 0 {
		if _, err := f.dst.Write(f.out); err != nil && f.err == nil {
			f.err = err
		}
	}
	if f.err != nil {
		return 0, f.err
	}
	return len(p), nil
}

// Close reports whether the stream ended where a JSON stream may end. It writes
// nothing of its own. A sniffing filter writes what it held back (closeHeld).
func (f *Filter) Close() error {
	if f.err != nil || f.passthrough {
		return f.err
	}
	if f.hold {
		return f.closeHeld()
	}
	if !f.begun && f.bomAt > 0 && f.bomAt < 3 {
		f.err = ErrTruncated // part of a BOM
		return f.err
	}
	if f.state == stNumber {
		if f.num < numAccept {
			f.err = ErrTruncated
			return f.err
		}
		f.valueDone()
	}
	if f.state != stTop {
		f.err = ErrTruncated
	}
	return f.err
}

// emit appends b to the output unless a removed member is being read.
func (f *Filter) emit(b []byte) {
	if !f.skipping {
		f.out = append(f.out, b...)
	}
}

func (f *Filter) emitByte(c byte) {
	if !f.skipping {
		f.out = append(f.out, c)
	}
}

func (f *Filter) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// space handles a run of whitespace between tokens.
func (f *Filter) space(ws []byte) {
	if f.state == stObjFirst || f.state == stObjKey {
		// Held back with the member that follows, and written only if it is kept.
		if !f.skipping {
			n := min(len(ws), maxPendingSpace-len(f.pendingSpace))
			f.pendingSpace = append(f.pendingSpace, ws[:max(n, 0)]...)
		}
		return
	}
	if !f.skipping && !f.dropSpace {
		f.out = append(f.out, ws...)
	}
}

// startKey begins a member name, its opening quote just read.
func (f *Filter) startKey() {
	f.state = stKey
	f.escaped, f.hexLeft = false, 0
	if f.skipping {
		f.keyUndecided = false // inside a removed value: nothing to decide
		return
	}
	f.keyUndecided, f.keyPlain = true, true
	f.key = append(f.key[:0], '"')
}

// stringBytes writes or buffers a run of a string's bytes.
func (f *Filter) stringBytes(b []byte) {
	if f.state != stKey || !f.keyUndecided {
		f.emit(b)
		return
	}
	if f.keyPlain {
		for _, c := range b {
			if c == '\\' || c >= utf8.RuneSelf {
				f.keyPlain = false
				break
			}
		}
	}
	f.key = append(f.key, b...)
	if len(f.key) > f.fields.keyLimit {
		// Too long to be a stripped name, however it is escaped. Keep the member,
		// and stream the rest of its name.
		f.keepMember()
	}
}

// stringDone moves on after a string's closing quote.
func (f *Filter) stringDone() {
	if f.state == stString {
		f.valueDone()
		return
	}
	f.state = stColon
	if !f.keyUndecided {
		return
	}
	if f.fields.Has(f.memberName()) {
		// Removed. Drop the name, the whitespace before it and the comma that was
		// waiting for it. Skip the value that follows.
		f.keyUndecided = false
		f.pendingSpace = f.pendingSpace[:0]
		f.skipping, f.skipDepth = true, len(f.stack)
		return
	}
	f.keepMember()
}

// keepMember writes the start of a member known to be kept. That is the comma it
// needs, the whitespace held back before it, and the name read so far.
func (f *Filter) keepMember() {
	top := &f.stack[len(f.stack)-1]
	if *top == frameObjectWrote {
		f.out = append(f.out, ',')
	}
	*top = frameObjectWrote
	f.out = append(f.out, f.pendingSpace...)
	f.out = append(f.out, f.key...)
	f.pendingSpace, f.key, f.keyUndecided = f.pendingSpace[:0], f.key[:0], false
}

// memberName returns the name of the buffered member, decoded as encoding/json
// decodes it: escapes resolved, invalid UTF-8 as U+FFFD. So an escaped
// "\u0063onfig" is still "config".
func (f *Filter) memberName() []byte {
	raw := f.key[1 : len(f.key)-1]
	if f.keyPlain || (utf8.Valid(raw) && !containsByte(raw, '\\')) {
		return raw
	}
	var s string
	if err := json.Unmarshal(f.key, &s); err != nil {
		return raw // cannot happen: the scanner has checked the string
	}
	return []byte(s)
}

func containsByte(b []byte, c byte) bool {
	for _, x := range b {
		if x == c {
			return true
		}
	}
	return false
}
