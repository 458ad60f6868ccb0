package caddymodule

import (
	"encoding/json"
	"errors"
	"io"
	"sync"
	"unicode"
	"unicode/utf8"
)

// fieldSet is the set of member names the JSON filter removes (strip_fields).
type fieldSet struct {
	names map[string]struct{}
	// keyLimit is the longest raw (still escaped) member name, quotes included, that
	// can decode to one of names: an escape takes at most 6 bytes for every byte it
	// decodes to. A longer name is kept without being buffered.
	keyLimit int
}

func newFieldSet(names []string) *fieldSet {
	s := &fieldSet{names: make(map[string]struct{}, len(names))}
	longest := 0
	for _, n := range names {
		s.names[string(foldName(nil, []byte(n)))] = struct{}{}
		longest = max(longest, len(n))
	}
	s.keyLimit = 6*longest + 2
	return s
}

// has reports whether the decoded member name is in s, matched case-insensitively as
// encoding/json matches a member to a struct field ("Config" and "CONFIG" are config
// to a Go client). It does not allocate for names of up to 64 bytes.
func (s *fieldSet) has(name []byte) bool {
	var buf [64]byte
	_, ok := s.names[string(foldName(buf[:0], name))]
	return ok
}

// foldName appends to out the case-folded in, as encoding/json folds names (its
// appendFoldedName): ASCII letters to upper case, any other rune to the smallest rune
// of its Unicode fold set, so that foldName(x) == foldName(y) exactly when
// bytes.EqualFold(x, y) ("ſ" is "S", "K" (Kelvin) is "K").
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

// maxDepth is the deepest nesting the filter accepts, as encoding/json: deeper
// documents are refused rather than tracked without bound.
const maxDepth = 10000

// maxPendingSpace bounds the whitespace held back between object members while the
// filter decides whether the next member is kept. Whitespace beyond it is dropped,
// which JSON does not notice.
const maxPendingSpace = 64

var (
	errJSONSyntax    = errors.New("json filter: invalid JSON from upstream")
	errJSONDepth     = errors.New("json filter: JSON nested deeper than 10000 levels")
	errJSONTruncated = errors.New("json filter: JSON from upstream ends mid-value")
)

// filterState is where the filter stands in the grammar.
type filterState uint8

const (
	stTop        filterState = iota // between top-level values
	stValue                         // a value must come (after ':', or ',' in an array)
	stArrayFirst                    // after '[': a value or ']'
	stObjFirst                      // after '{': a member name or '}'
	stObjKey                        // after ',' in an object: a member name
	stColon                         // after a member name: ':'
	stAfter                         // after a value in a container: ',' or its closing bracket
	stString                        // inside a string value
	stKey                           // inside a member name
	stNumber                        // inside a number
	stLiteral                       // inside true, false or null
)

// Stack entries: the open containers.
const (
	frameArray       byte = '['
	frameObject      byte = '{'
	frameObjectWrote byte = '}' // an object at least one member of which was written
)

// Number states, numAccept and above end a valid number.
const (
	numMinus     uint8 = iota // after '-'
	numDot                    // after '.'
	numExp                    // after 'e' or 'E'
	numExpSign                // after the exponent's sign
	numAccept                 // marker: the states below end a valid number
	numZero                   // a leading 0
	numInt                    // integer digits
	numFrac                   // fraction digits
	numExpDigits              // exponent digits
)

// jsonFilter is a streaming JSON filter: an io.Writer that copies a stream of JSON
// values to dst, leaving out every object member whose name is in fields, at any
// depth, with the commas around it. It is a hand-written tokenizer, never decodes the
// document, and holds at most one member name and a little whitespace besides the
// chunk being written, so its memory does not grow with the document: a 50 MB array
// streams through.
//
// Its grammar is encoding/json's Decoder's: any number of JSON values, one after
// another (NDJSON and concatenated JSON included). Invalid JSON is an error, from
// Write or Close, after which nothing more is written: the filter cannot tell member
// names from values in a document it cannot parse, so it stops rather than guess.
// What was written before the error is valid-so-far output with every stripped
// member already removed.
//
// Insignificant whitespace is copied, except inside removed members and beyond
// maxPendingSpace bytes between two members.
type jsonFilter struct {
	dst    io.Writer
	fields *fieldSet
	// sniff makes the filter pass the body through untouched unless its first
	// non-whitespace byte (after an optional UTF-8 BOM) opens an object or an array:
	// for bodies whose Content-Type does not say JSON.
	sniff       bool
	passthrough bool
	begun       bool  // a byte other than the BOM's has been read
	bomAt       uint8 // how many bytes of a leading UTF-8 BOM have been read
	// hold (with sniff) keeps a body back until it is known to be JSON: the input in
	// orig, the filtered output in held. At Close, or when the filter fails, the
	// filtered output or the body untouched goes out. Past holdLimit bytes the body
	// is taken for the JSON it has been so far, and streams.
	hold       bool
	orig, held []byte

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

	// skipping is true while a removed member is read: nothing is written until the
	// value at depth skipDepth ends.
	skipping  bool
	skipDepth int
	// dropSpace is true between the end of a removed member and the next ',' or
	// '}': the whitespace there belongs to the removed member.
	dropSpace bool

	err error
}

// utf8BOM is the byte order mark some encoders put before a UTF-8 document.
var utf8BOM = [3]byte{0xEF, 0xBB, 0xBF}

var filterPool = sync.Pool{New: func() any { return new(jsonFilter) }}

// newJSONFilter returns a filter writing to dst, from a pool; release it with
// putJSONFilter once done.
func newJSONFilter(dst io.Writer, fields *fieldSet, sniff bool) *jsonFilter {
	f := filterPool.Get().(*jsonFilter)
	*f = jsonFilter{
		dst: dst, fields: fields, sniff: sniff, hold: sniff,
		out: f.out[:0], stack: f.stack[:0], key: f.key[:0], pendingSpace: f.pendingSpace[:0],
	}
	return f
}

// holdLimit bounds the body a sniffing filter keeps back; see jsonFilter.hold.
const holdLimit = 1 << 20

// writeHeld handles one Write while the body is held back.
func (f *jsonFilter) writeHeld(p []byte) (int, error) {
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
func (f *jsonFilter) flushHeld(b []byte) error {
	_, err := f.dst.Write(b)
	f.orig, f.held = nil, nil
	if err != nil {
		f.err = err
	}
	return err
}

func putJSONFilter(f *jsonFilter) {
	if cap(f.out) > 64<<10 {
		f.out = nil // do not keep the buffer of one huge Write forever
	}
	f.dst, f.fields = nil, nil
	filterPool.Put(f)
}

// Write filters p, a piece of the stream cut anywhere, and writes what it can
// already decide to dst.
func (f *jsonFilter) Write(p []byte) (int, error) {
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
// nothing of its own, but what a sniffing filter held back: the filtered body if it
// was JSON, the body untouched if not.
func (f *jsonFilter) Close() error {
	if f.err != nil || f.passthrough {
		return f.err
	}
	if f.hold {
		f.hold = false
		if err := f.Close(); err != nil {
			f.err = nil
			return f.flushHeld(f.orig)
		}
		return f.flushHeld(f.held)
	}
	if !f.begun && f.bomAt > 0 && f.bomAt < 3 {
		f.err = errJSONTruncated // part of a BOM
		return f.err
	}
	if f.state == stNumber {
		if f.num < numAccept {
			f.err = errJSONTruncated
			return f.err
		}
		f.valueDone()
	}
	if f.state != stTop {
		f.err = errJSONTruncated
	}
	return f.err
}

// emit appends b to the output unless a removed member is being read.
func (f *jsonFilter) emit(b []byte) {
	if !f.skipping {
		f.out = append(f.out, b...)
	}
}

func (f *jsonFilter) emitByte(c byte) {
	if !f.skipping {
		f.out = append(f.out, c)
	}
}

func (f *jsonFilter) fail(err error) {
	if f.err == nil {
		f.err = err
	}
}

// scan runs p through the state machine, appending the output to f.out.
func (f *jsonFilter) scan(p []byte) {
	i := 0
	for i < len(p) && f.err == nil {
		switch f.state {
		case stString, stKey:
			i = f.scanString(p, i)
			continue
		case stNumber:
			i = f.scanNumber(p, i)
			continue
		case stLiteral:
			i = f.scanLiteral(p, i)
			continue
		}

		c := p[i]
		if !f.begun {
			// An optional UTF-8 BOM, copied, as the very first bytes.
			if f.bomAt < 3 && c == utf8BOM[f.bomAt] {
				f.bomAt++
				f.out = append(f.out, c)
				i++
				continue
			}
			if f.bomAt > 0 && f.bomAt < 3 {
				if f.sniff {
					f.passthrough = true
					f.out = append(f.out, p[i:]...)
					return
				}
				f.fail(errJSONSyntax)
				return
			}
			f.begun = true
		}
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			start := i
			for i < len(p) && (p[i] == ' ' || p[i] == '\t' || p[i] == '\n' || p[i] == '\r') {
				i++
			}
			f.space(p[start:i])
			continue
		}
		i++
		f.dropSpace = false
		switch f.state {
		case stTop:
			if f.sniff {
				f.sniff = false
				if c != '{' && c != '[' {
					// Not a JSON container: nothing to strip. Pass the rest through.
					f.passthrough = true
					f.out = append(f.out, p[i-1:]...)
					return
				}
			}
			f.startValue(c)
		case stValue:
			f.startValue(c)
		case stArrayFirst:
			if c == ']' {
				f.closeContainer(c)
			} else {
				f.startValue(c)
			}
		case stObjFirst, stObjKey:
			switch {
			case c == '"':
				f.startKey()
			case c == '}' && f.state == stObjFirst:
				f.emit(f.pendingSpace)
				f.pendingSpace = f.pendingSpace[:0]
				f.closeContainer(c)
			default:
				f.fail(errJSONSyntax)
			}
		case stColon:
			if c != ':' {
				f.fail(errJSONSyntax)
				break
			}
			f.emitByte(c)
			f.state = stValue
		case stAfter:
			top := f.stack[len(f.stack)-1]
			switch {
			case c == ',' && top == frameArray:
				f.emitByte(c)
				f.state = stValue
			case c == ',':
				// An object's commas are written by the member after them, once it is
				// known to be kept.
				f.state = stObjKey
			case c == ']' && top == frameArray, c == '}' && top != frameArray:
				f.closeContainer(c)
			default:
				f.fail(errJSONSyntax)
			}
		}
	}
}

// space handles a run of whitespace between tokens.
func (f *jsonFilter) space(ws []byte) {
	if f.state == stObjFirst || f.state == stObjKey {
		// Held back with the member that follows: written only if it is kept.
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

// startValue begins the value whose first byte is c.
func (f *jsonFilter) startValue(c byte) {
	switch c {
	case '{', '[':
		if len(f.stack) >= maxDepth {
			f.fail(errJSONDepth)
			return
		}
		f.emitByte(c)
		if c == '{' {
			f.stack = append(f.stack, frameObject)
			f.state = stObjFirst
		} else {
			f.stack = append(f.stack, frameArray)
			f.state = stArrayFirst
		}
	case '"':
		f.emitByte(c)
		f.state = stString
	case 't':
		f.startLiteral("true")
	case 'f':
		f.startLiteral("false")
	case 'n':
		f.startLiteral("null")
	case '-':
		f.emitByte(c)
		f.state, f.num = stNumber, numMinus
	case '0':
		f.emitByte(c)
		f.state, f.num = stNumber, numZero
	default:
		if c >= '1' && c <= '9' {
			f.emitByte(c)
			f.state, f.num = stNumber, numInt
			return
		}
		f.fail(errJSONSyntax)
	}
}

func (f *jsonFilter) startLiteral(lit string) {
	f.emitByte(lit[0])
	f.state, f.lit, f.litPos = stLiteral, lit, 1
}

// closeContainer ends the innermost container with c, its closing bracket.
func (f *jsonFilter) closeContainer(c byte) {
	f.emitByte(c)
	f.stack = f.stack[:len(f.stack)-1]
	f.valueDone()
}

// valueDone moves on after a complete value.
func (f *jsonFilter) valueDone() {
	if len(f.stack) == 0 {
		f.state = stTop
	} else {
		f.state = stAfter
	}
	if f.skipping && len(f.stack) == f.skipDepth {
		f.skipping, f.dropSpace = false, true
	}
}

// startKey begins a member name, its opening quote just read.
func (f *jsonFilter) startKey() {
	f.state = stKey
	f.escaped, f.hexLeft = false, 0
	if f.skipping {
		f.keyUndecided = false // inside a removed value: nothing to decide
		return
	}
	f.keyUndecided, f.keyPlain = true, true
	f.key = append(f.key[:0], '"')
}

// stringSpecial marks the bytes that end the plain run of a string.
var stringSpecial = func() (t [256]bool) {
	for c := 0; c < 0x20; c++ {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// scanString reads string bytes from p[i:] and returns where it stopped: the end of
// p, or just past the closing quote.
func (f *jsonFilter) scanString(p []byte, i int) int {
	start := i
	for i < len(p) {
		c := p[i]
		switch {
		case f.hexLeft > 0:
			if !isHex(c) {
				f.fail(errJSONSyntax)
				return len(p)
			}
			f.hexLeft--
			i++
			continue
		case f.escaped:
			switch c {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				f.hexLeft = 4
			default:
				f.fail(errJSONSyntax)
				return len(p)
			}
			f.escaped = false
			i++
			continue
		}
		for i < len(p) && !stringSpecial[p[i]] {
			i++
		}
		if i == len(p) {
			break
		}
		switch c = p[i]; {
		case c == '\\':
			f.escaped = true
			i++
		case c == '"':
			i++
			f.stringBytes(p[start:i])
			f.stringDone()
			return i
		default: // a control character
			f.fail(errJSONSyntax)
			return len(p)
		}
	}
	f.stringBytes(p[start:i])
	return i
}

// stringBytes writes or buffers a run of a string's bytes.
func (f *jsonFilter) stringBytes(b []byte) {
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
		// Too long to be a stripped name however it is escaped: keep the member
		// and stream the rest of its name.
		f.keepMember()
	}
}

// stringDone moves on after a string's closing quote.
func (f *jsonFilter) stringDone() {
	if f.state == stString {
		f.valueDone()
		return
	}
	f.state = stColon
	if !f.keyUndecided {
		return
	}
	if f.fields.has(f.memberName()) {
		// Removed: drop the name, the whitespace before it and the comma that
		// was waiting for it, and skip the value that follows.
		f.keyUndecided = false
		f.pendingSpace = f.pendingSpace[:0]
		f.skipping, f.skipDepth = true, len(f.stack)
		return
	}
	f.keepMember()
}

// keepMember writes the start of a member known to be kept: the comma it needs,
// the whitespace held back before it, and the name read so far.
func (f *jsonFilter) keepMember() {
	top := &f.stack[len(f.stack)-1]
	if *top == frameObjectWrote {
		f.out = append(f.out, ',')
	}
	*top = frameObjectWrote
	f.out = append(f.out, f.pendingSpace...)
	f.out = append(f.out, f.key...)
	f.pendingSpace, f.key, f.keyUndecided = f.pendingSpace[:0], f.key[:0], false
}

// memberName returns the decoded name of the buffered member, decoded as
// encoding/json does (escapes resolved, invalid UTF-8 as U+FFFD), so that an
// escaped "\u0063onfig" is still "config".
func (f *jsonFilter) memberName() []byte {
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

// scanNumber reads number bytes from p[i:]. A number ends at the first byte that
// cannot continue it, which is then read again as what follows the number.
func (f *jsonFilter) scanNumber(p []byte, i int) int {
	start := i
	for ; i < len(p); i++ {
		c := p[i]
		digit := c >= '0' && c <= '9'
		next := uint8(255)
		switch f.num {
		case numMinus:
			if c == '0' {
				next = numZero
			} else if digit {
				next = numInt
			}
		case numZero:
			next = afterInt(c)
		case numInt:
			if digit {
				next = numInt
			} else {
				next = afterInt(c)
			}
		case numDot:
			if digit {
				next = numFrac
			}
		case numFrac:
			if digit {
				next = numFrac
			} else if c == 'e' || c == 'E' {
				next = numExp
			}
		case numExp:
			if c == '+' || c == '-' {
				next = numExpSign
			} else if digit {
				next = numExpDigits
			}
		case numExpSign, numExpDigits:
			if digit {
				next = numExpDigits
			}
		}
		if next == 255 {
			f.emit(p[start:i])
			if f.num < numAccept {
				f.fail(errJSONSyntax)
				return len(p)
			}
			f.valueDone()
			return i
		}
		f.num = next
	}
	f.emit(p[start:i])
	return i
}

func afterInt(c byte) uint8 {
	switch c {
	case '.':
		return numDot
	case 'e', 'E':
		return numExp
	}
	return 255
}

// scanLiteral reads the rest of true, false or null from p[i:].
func (f *jsonFilter) scanLiteral(p []byte, i int) int {
	start := i
	for i < len(p) && f.litPos < len(f.lit) {
		if p[i] != f.lit[f.litPos] {
			f.fail(errJSONSyntax)
			return len(p)
		}
		i++
		f.litPos++
	}
	f.emit(p[start:i])
	if f.litPos == len(f.lit) {
		f.valueDone()
	}
	return i
}

func isHex(c byte) bool {
	return c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F'
}
