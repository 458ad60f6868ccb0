package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/keygate/keygate/upstream/apperr"
)

// decodeObject reads body as exactly one JSON object. It calls field for each member
// in document order and stops at the first error. The body must be one object with
// only white space after it, or the error names "body". A repeated member is an error
// naming it. Both are apperr.EINVALID.
func decodeObject(body []byte, field func(name string, raw json.RawMessage) error) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return apperr.Invalid("body", "must be a JSON object")
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return apperr.Invalid("body", "must be a JSON object")
	}
	seen := make(map[string]bool)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return apperr.Invalid("body", "is not valid JSON")
		}
		name, ok := tok.(string)
		if !ok {
			return apperr.Invalid("body", "is not valid JSON")
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return apperr.Invalid("body", "is not valid JSON")
		}
		if seen[name] {
			return apperr.Invalid(name, "appears more than once")
		}
		seen[name] = true
		if err := field(name, raw); err != nil {
			return err
		}
	}
	if _, err := dec.Token(); err != nil {
		return apperr.Invalid("body", "is not valid JSON")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return apperr.Invalid("body", "must hold a single JSON object and nothing after it")
	}
	return nil
}

// decodeObjectInto decodes body as one JSON object into a T. field fills v from each
// member, as in decodeObject. Every name of required must then have been a member.
// The first one absent is an apperr.EINVALID error: "required", naming prefix+name.
// prefix is "" for a body and "[0]." for the first object of an array. On an error
// decodeObjectInto returns the zero T.
func decodeObjectInto[T any](body []byte, prefix string, required []string, field func(v *T, name string, raw json.RawMessage) error) (T, error) {
	var v, zero T
	seen := make(map[string]bool)
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		seen[name] = true
		return field(&v, name, raw)
	})
	if err != nil {
		return zero, err
	}
	for _, name := range required {
		if !seen[name] {
			return zero, apperr.Invalid(prefix+name, "required")
		}
	}
	return v, nil
}

// kindOf names the JSON kind of raw, for error messages.
func kindOf(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "nothing"
	}
	switch raw[0] {
	case 'n':
		return "null"
	case 't', 'f':
		return "a boolean"
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	}
	return "a number"
}

// decodeString decodes raw, which must be a JSON string (not null).
func decodeString(name string, raw json.RawMessage) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", apperr.Invalid(name, "must be a string, not %s", kindOf(raw))
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", apperr.Invalid(name, "must be a string")
	}
	return s, nil
}

// decodeText decodes a string that checkText accepts.
func decodeText(name string, raw json.RawMessage, minLen, maxLen int) (string, error) {
	s, err := decodeString(name, raw)
	if err != nil {
		return "", err
	}
	if err := checkText(name, s, minLen, maxLen); err != nil {
		return "", err
	}
	return s, nil
}

// checkText checks that s has minLen to maxLen characters and no control characters.
// PostgreSQL's text type can then store it.
func checkText(name, s string, minLen, maxLen int) error {
	if n := utf8.RuneCountInString(s); n < minLen || n > maxLen {
		return apperr.Invalid(name, "must be %d to %d characters long", minLen, maxLen)
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return apperr.Invalid(name, "must not contain control characters")
		}
	}
	return nil
}

// decodeInt decodes raw, a JSON integer literal of 32 bits. A fraction, an exponent or
// a string is an error.
func decodeInt(name string, raw json.RawMessage) (int, error) {
	if len(raw) == 0 || !(raw[0] == '-' || raw[0] >= '0' && raw[0] <= '9') {
		return 0, apperr.Invalid(name, "must be an integer, not %s", kindOf(raw))
	}
	n, err := strconv.ParseInt(string(raw), 10, 32)
	if err != nil {
		return 0, apperr.Invalid(name, "must be an integer")
	}
	return int(n), nil
}

// decodeBool decodes raw, which must be true or false.
func decodeBool(name string, raw json.RawMessage) (bool, error) {
	switch string(raw) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, apperr.Invalid(name, "must be a boolean, not %s", kindOf(raw))
}

// decodeTime decodes an RFC 3339 timestamp string.
func decodeTime(name string, raw json.RawMessage) (time.Time, error) {
	s, err := decodeString(name, raw)
	if err != nil {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, apperr.Invalid(name, "must be an RFC 3339 timestamp")
	}
	return t, nil
}

// maxJSONDepth bounds the nesting of the free-form config and assertions. PostgreSQL's
// jsonb parser accepts far deeper.
const maxJSONDepth = 64

// decodeFreeJSON decodes raw, a JSON value of the kind want: '{' object or '[' array.
// It checks that PostgreSQL's jsonb can store it (storableJSON). It returns it
// re-encoded. So unpaired surrogate escapes, which jsonb refuses, become U+FFFD, as in
// every Go string.
func decodeFreeJSON(name string, raw json.RawMessage, want byte) ([]byte, error) {
	if len(raw) == 0 || raw[0] != want {
		kind := "an object"
		if want == '[' {
			kind = "an array"
		}
		return nil, apperr.Invalid(name, "must be %s, not %s", kind, kindOf(raw))
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, apperr.Invalid(name, "is not valid JSON")
	}
	if err := storableJSON(name, v, 0); err != nil {
		return nil, err
	}
	out, err := json.Marshal(v)
	if err != nil {
		return nil, apperr.Invalid(name, "is not valid JSON")
	}
	return out, nil
}

// storableJSON checks v, decoded with UseNumber, against jsonb's limits: no NUL
// character, numbers within range, bounded depth.
func storableJSON(name string, v any, depth int) error {
	if depth > maxJSONDepth {
		return apperr.Invalid(name, "is nested more than %d levels deep", maxJSONDepth)
	}
	switch v := v.(type) {
	case string:
		if !storableString(v) {
			return apperr.Invalid(name, "must not contain the character U+0000")
		}
	case json.Number:
		// A number must lie in the range of a float64, which RFC 8259 calls
		// interoperable. It must have at most 100 characters. That keeps it well within
		// jsonb's numeric. A float64 of zero from digits that are not all zeros is an
		// underflow.
		f, err := strconv.ParseFloat(string(v), 64)
		if err != nil || len(v) > 100 || (f == 0 && strings.ContainsAny(mantissa(string(v)), "123456789")) {
			return apperr.Invalid(name, "holds a number out of range")
		}
	case []any:
		for _, e := range v {
			if err := storableJSON(name, e, depth+1); err != nil {
				return err
			}
		}
	case map[string]any:
		for k, e := range v {
			if !storableString(k) {
				return apperr.Invalid(name, "must not contain the character U+0000")
			}
			if err := storableJSON(name, e, depth+1); err != nil {
				return err
			}
		}
	}
	return nil
}

// mantissa returns the part of a JSON number before its exponent.
func mantissa(n string) string {
	for i := 0; i < len(n); i++ {
		if n[i] == 'e' || n[i] == 'E' {
			return n[:i]
		}
	}
	return n
}

// storableString reports whether s has no NUL, so jsonb can store it.
func storableString(s string) bool {
	return strings.IndexByte(s, 0) < 0
}
