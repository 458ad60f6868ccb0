package fieldstrip

import "errors"

// This file holds the JSON filter's grammar: the tokenizer's states and the scan of
// containers, strings, numbers and literals. filter.go holds what the filter
// does with object members, and sniff.go its mode for bodies not labelled JSON.

// MaxDepth is the deepest nesting the filter accepts, as encoding/json: deeper
// documents are refused rather than tracked without bound.
const MaxDepth = 10000

var (
	ErrSyntax    = errors.New("json filter: invalid JSON from upstream")
	ErrDepth     = errors.New("json filter: JSON nested deeper than 10000 levels")
	ErrTruncated = errors.New("json filter: JSON from upstream ends mid-value")
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

// utf8BOM is the byte order mark some encoders put before a UTF-8 document.
var utf8BOM = [3]byte{0xEF, 0xBB, 0xBF}

// scan runs p through the state machine, appending the output to f.out.
func (f *Filter) scan(p []byte) {
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
					f.passRest(p[i:])
					return
				}
				f.fail(ErrSyntax)
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
					f.passRest(p[i-1:]) // not a JSON container: nothing to strip
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
				f.fail(ErrSyntax)
			}
		case stColon:
			if c != ':' {
				f.fail(ErrSyntax)
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
				f.fail(ErrSyntax)
			}
		}
	}
}

// startValue begins the value whose first byte is c.
func (f *Filter) startValue(c byte) {
	switch c {
	case '{', '[':
		if len(f.stack) >= MaxDepth {
			f.fail(ErrDepth)
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
		f.fail(ErrSyntax)
	}
}

func (f *Filter) startLiteral(lit string) {
	f.emitByte(lit[0])
	f.state, f.lit, f.litPos = stLiteral, lit, 1
}

// closeContainer ends the innermost container with c, its closing bracket.
func (f *Filter) closeContainer(c byte) {
	f.emitByte(c)
	f.stack = f.stack[:len(f.stack)-1]
	f.valueDone()
}

// valueDone moves on after a complete value.
func (f *Filter) valueDone() {
	if len(f.stack) == 0 {
		f.state = stTop
	} else {
		f.state = stAfter
	}
	if f.skipping && len(f.stack) == f.skipDepth {
		f.skipping, f.dropSpace = false, true
	}
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
func (f *Filter) scanString(p []byte, i int) int {
	start := i
	for i < len(p) {
		c := p[i]
		switch {
		case f.hexLeft > 0:
			if !isHex(c) {
				f.fail(ErrSyntax)
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
				f.fail(ErrSyntax)
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
			f.fail(ErrSyntax)
			return len(p)
		}
	}
	f.stringBytes(p[start:i])
	return i
}

// scanNumber reads number bytes from p[i:]. A number ends at the first byte that
// cannot continue it, which is then read again as what follows the number.
func (f *Filter) scanNumber(p []byte, i int) int {
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
				f.fail(ErrSyntax)
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
func (f *Filter) scanLiteral(p []byte, i int) int {
	start := i
	for i < len(p) && f.litPos < len(f.lit) {
		if p[i] != f.lit[f.litPos] {
			f.fail(ErrSyntax)
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
