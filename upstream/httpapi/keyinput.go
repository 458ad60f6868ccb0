package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// The inputs of a key's creation, roll and update. The API's JSON body and the
// dashboard's form decode into the same types. The two decoders share the check of
// each field. So a bad value gets the same message at both doors. The rules of a key's
// own settings (rate_limit and its windows', allowed_cidrs, scopes) are package
// keystore's, said in its words (settingError); the rate limits are checked against
// the plan when the key is written.

// createKeyInput is what a key's creation takes (createKey).
type createKeyInput struct {
	Name      string
	Role      keystore.Role
	ExpiresAt *time.Time // nil: the key lives until revoked
	RateLimit *int       // nil: the plan's
	// WindowLimits are the key's own limits in its windows beside its minute; nil
	// each: the plan's.
	WindowLimits keystore.WindowLimits
	// AllowedCIDRs are the networks the key may be used from; empty: anywhere.
	AllowedCIDRs []netip.Prefix
	// Scopes are the key's scopes; nil: everything its role allows.
	Scopes []string
}

// rollKeyInput is what a key's roll takes (rollKey).
type rollKeyInput struct {
	// Grace is how long the old key keeps working. 0 stops it at once.
	Grace time.Duration
}

// maxKeyName is the longest name of a key, in characters.
const maxKeyName = 100

// formExpiry is the layout of an <input type="datetime-local">. The form reads it as UTC.
const formExpiry = "2006-01-02T15:04"

// decodeCreateKey decodes a creation body {"name","role","expires_at"?}. The members
// are checked in body order. A null expires_at means the key never expires.
func decodeCreateKey(body []byte, now time.Time) (createKeyInput, error) {
	required := []string{"name", "role"}
	return decodeObjectInto(body, "", required, func(in *createKeyInput, name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			in.Name, err = decodeText(name, raw, 1, maxKeyName)
		case "role":
			var role string
			if role, err = decodeString(name, raw); err == nil {
				in.Role, err = keyRole(role)
			}
		case "expires_at":
			if string(raw) == "null" {
				return nil
			}
			var t time.Time
			if t, err = decodeTime(name, raw); err == nil {
				in.ExpiresAt, err = keyExpiry(t, now)
			}
		case keystore.FieldRateLimit:
			in.RateLimit, err = decodeKeyRateLimit(name, raw)
		case keystore.FieldAllowedCIDRs:
			in.AllowedCIDRs, err = decodeKeyCIDRs(raw)
		case keystore.FieldScopes:
			in.Scopes, err = decodeKeyScopes(raw)
		default:
			w, ok := keyWindow(name)
			if !ok {
				return apperr.Invalid(name, "unknown field")
			}
			in.WindowLimits[w], err = decodeKeyRateLimit(name, raw)
		}
		return err
	})
}

// keyWindow returns the window whose limit is a key's setting name.
func keyWindow(name string) (keystore.Window, bool) {
	for w := range keystore.Window(keystore.NumWindows) {
		if w.Field() == name {
			return w, true
		}
	}
	return 0, false
}

// createKeyForm reads the dashboard's create form. Its fields are checked in the order
// expires_at, name, role, rate_limit, its windows', allowed_cidrs, scopes. An empty
// expires_at means the key never expires, an empty rate limit the plan's limit, an
// empty allowed_cidrs anywhere, no scope checked everything the role allows.
func createKeyForm(form url.Values, now time.Time) (createKeyInput, error) {
	var in createKeyInput
	if v := form.Get("expires_at"); v != "" {
		t, err := time.Parse(formExpiry, v)
		if err != nil {
			return createKeyInput{}, apperr.Invalid("expires_at", "must be a date and time")
		}
		if in.ExpiresAt, err = keyExpiry(t, now); err != nil {
			return createKeyInput{}, err
		}
	}
	in.Name = jsonText(form.Get("name"))
	if err := checkText("name", in.Name, 1, maxKeyName); err != nil {
		return createKeyInput{}, err
	}
	role, err := keyRole(form.Get("role"))
	if err != nil {
		return createKeyInput{}, err
	}
	in.Role = role
	if in.RateLimit, in.WindowLimits, err = formRateLimits(form); err != nil {
		return createKeyInput{}, err
	}
	if in.AllowedCIDRs, err = formCIDRs(form); err != nil {
		return createKeyInput{}, err
	}
	if in.Scopes, err = formScopes(form); err != nil {
		return createKeyInput{}, err
	}
	return in, nil
}

// decodeKeyRateLimit decodes a key's rate limit named name, rate_limit or a window's:
// an integer, or null for the plan's. Its range depends on the plan (keystore checks
// it when the key is written).
func decodeKeyRateLimit(name string, raw json.RawMessage) (*int, error) {
	if string(raw) == "null" {
		return nil, nil
	}
	n, err := decodeInt(name, raw)
	if err != nil {
		return nil, err
	}
	return &n, nil
}

// decodeKeyCIDRs decodes a key's allowed_cidrs: an array of strings, each an IPv4 or
// IPv6 CIDR or address (keystore.ParseAllowedCIDRs).
func decodeKeyCIDRs(raw json.RawMessage) ([]netip.Prefix, error) {
	const name = keystore.FieldAllowedCIDRs
	if len(raw) == 0 || raw[0] != '[' {
		return nil, apperr.Invalid(name, "must be an array of strings, not %s", kindOf(raw))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, apperr.Invalid(name, "must be an array of strings")
	}
	list := make([]string, 0, len(elems))
	for _, e := range elems {
		s, err := decodeString(name, e)
		if err != nil {
			return nil, apperr.Invalid(name, "must be an array of strings")
		}
		list = append(list, s)
	}
	cidrs, err := keystore.ParseAllowedCIDRs(list)
	return cidrs, settingError(err)
}

// decodeKeyScopes decodes a key's scopes: an array of strings (keystore.ParseScopes),
// or null for everything the role allows.
func decodeKeyScopes(raw json.RawMessage) ([]string, error) {
	const name = keystore.FieldScopes
	if string(raw) == "null" {
		return nil, nil
	}
	if len(raw) == 0 || raw[0] != '[' {
		return nil, apperr.Invalid(name, "must be an array of strings or null, not %s", kindOf(raw))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, apperr.Invalid(name, "must be an array of strings or null")
	}
	list := make([]string, 0, len(elems))
	for _, e := range elems {
		s, err := decodeString(name, e)
		if err != nil {
			return nil, apperr.Invalid(name, "must be an array of strings or null")
		}
		list = append(list, s)
	}
	scopes, err := keystore.ParseScopes(list)
	return scopes, settingError(err)
}

// formScopes reads a form's scopes: one checkbox a scope. None checked is everything
// the role allows.
func formScopes(form url.Values) ([]string, error) {
	list := form[keystore.FieldScopes]
	if len(list) == 0 {
		return nil, nil
	}
	scopes, err := keystore.ParseScopes(list)
	return scopes, settingError(err)
}

// formRateLimits reads a form's rate_limit and its windows' limits, in that order:
// empty is the plan's limit.
func formRateLimits(form url.Values) (minute *int, windows keystore.WindowLimits, err error) {
	if minute, err = formRateLimit(form, keystore.FieldRateLimit, "a minute"); err != nil {
		return nil, windows, err
	}
	for w := range keystore.Window(keystore.NumWindows) {
		if windows[w], err = formRateLimit(form, w.Field(), w.Unit()); err != nil {
			return nil, windows, err
		}
	}
	return minute, windows, nil
}

// formRateLimit reads a form's rate limit named name, of requests per unit: empty is
// the plan's limit.
func formRateLimit(form url.Values, name, unit string) (*int, error) {
	v := strings.TrimSpace(form.Get(name))
	if v == "" {
		return nil, nil
	}
	n, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return nil, apperr.Invalid(name, "must be a whole number of requests %s", unit)
	case n != int(int32(n)):
		// The bound decodeInt puts on every JSON integer.
		return nil, apperr.Invalid(name, "must be an integer")
	}
	return &n, nil
}

// formCIDRs reads a form's allowed_cidrs: networks separated by commas, line breaks or
// both, white space around each ignored. Empty is anywhere.
func formCIDRs(form url.Values) ([]netip.Prefix, error) {
	fields := strings.FieldsFunc(form.Get(keystore.FieldAllowedCIDRs), func(r rune) bool {
		return r == ',' || r == '\n' || r == '\r'
	})
	list := make([]string, 0, len(fields))
	for _, f := range fields {
		if f = strings.TrimSpace(f); f != "" {
			list = append(list, f)
		}
	}
	cidrs, err := keystore.ParseAllowedCIDRs(list)
	return cidrs, settingError(err)
}

// settingError returns a keystore.SettingError as the apperr.EINVALID error naming its
// field, and any other err as it is.
func settingError(err error) error {
	var se *keystore.SettingError
	if errors.As(err, &se) {
		return apperr.Invalid(se.Field, "%s", se.Reason)
	}
	return err
}

// errNoSetting is an update that sets no setting.
var errNoSetting = apperr.Invalid("body", "must set at least one of rate_limit, rate_limit_per_second, rate_limit_per_hour, "+
	"rate_limit_per_day, allowed_cidrs and scopes")

// decodeUpdateKey decodes an update body {"rate_limit"?,"rate_limit_per_second"?,
// "rate_limit_per_hour"?,"rate_limit_per_day"?,"allowed_cidrs"?,"scopes"?}, which sets
// at least one of them. A null rate limit is the plan's; an empty allowed_cidrs is
// anywhere; null scopes are everything the role allows.
func decodeUpdateKey(body []byte) (keystore.Update, error) {
	if len(bytes.TrimSpace(body)) == 0 {
		return keystore.Update{}, errNoSetting
	}
	u, err := decodeObjectInto(body, "", nil, func(u *keystore.Update, name string, raw json.RawMessage) error {
		var err error
		switch name {
		case keystore.FieldRateLimit:
			u.SetRateLimit = true
			u.RateLimit, err = decodeKeyRateLimit(name, raw)
		case keystore.FieldAllowedCIDRs:
			u.SetAllowedCIDRs = true
			u.AllowedCIDRs, err = decodeKeyCIDRs(raw)
		case keystore.FieldScopes:
			u.SetScopes = true
			u.Scopes, err = decodeKeyScopes(raw)
		default:
			w, ok := keyWindow(name)
			if !ok {
				return apperr.Invalid(name, "unknown field")
			}
			u.SetWindowLimits[w] = true
			u.WindowLimits[w], err = decodeKeyRateLimit(name, raw)
		}
		return err
	})
	if err == nil && u.Empty() {
		err = errNoSetting
	}
	return u, err
}

// updateKeyForm reads a key's settings form, which sets them all: an empty rate limit
// is the plan's, an empty allowed_cidrs anywhere, no scope checked everything the role
// allows.
func updateKeyForm(form url.Values) (keystore.Update, error) {
	u := keystore.Update{SetRateLimit: true, SetWindowLimits: [keystore.NumWindows]bool{true, true, true}, SetAllowedCIDRs: true, SetScopes: true}
	var err error
	if u.RateLimit, u.WindowLimits, err = formRateLimits(form); err != nil {
		return keystore.Update{}, err
	}
	if u.AllowedCIDRs, err = formCIDRs(form); err != nil {
		return keystore.Update{}, err
	}
	if u.Scopes, err = formScopes(form); err != nil {
		return keystore.Update{}, err
	}
	return u, nil
}

// keyRole checks the role of a new key.
func keyRole(s string) (keystore.Role, error) {
	if !keystore.Role(s).Valid() {
		return "", apperr.Invalid("role", "must be one of Admin, Editor, Viewer")
	}
	return keystore.Role(s), nil
}

// keyExpiry checks that a new key's expiry t is after now.
func keyExpiry(t, now time.Time) (*time.Time, error) {
	if !t.After(now) {
		return nil, apperr.Invalid("expires_at", "must be in the future")
	}
	return &t, nil
}

// jsonText returns s as encoding/json decodes a string. Each byte that is not UTF-8
// becomes U+FFFD, which PostgreSQL can store.
func jsonText(s string) string {
	return string([]rune(s))
}

// decodeRollKey decodes a roll body {"grace_seconds"?}. An empty body, or one without
// grace_seconds, is a grace of 0.
func decodeRollKey(body []byte) (rollKeyInput, error) {
	var in rollKeyInput
	if len(bytes.TrimSpace(body)) == 0 {
		return in, nil
	}
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		if name != "grace_seconds" {
			return apperr.Invalid(name, "unknown field")
		}
		secs, err := decodeInt(name, raw)
		if err == nil {
			in.Grace, err = keyGrace(secs)
		}
		return err
	})
	if err != nil {
		return rollKeyInput{}, err
	}
	return in, nil
}

// rollKeyForm reads the dashboard's roll form. An empty grace_seconds is a grace of 0.
func rollKeyForm(form url.Values) (rollKeyInput, error) {
	v := form.Get("grace_seconds")
	if v == "" {
		return rollKeyInput{}, nil
	}
	secs, err := strconv.Atoi(v)
	switch {
	case err != nil:
		return rollKeyInput{}, apperr.Invalid("grace_seconds", "must be a whole number of seconds")
	case secs != int(int32(secs)):
		// The bound decodeInt puts on every JSON integer.
		return rollKeyInput{}, apperr.Invalid("grace_seconds", "must be an integer")
	}
	grace, err := keyGrace(secs)
	if err != nil {
		return rollKeyInput{}, err
	}
	return rollKeyInput{Grace: grace}, nil
}

// keyGrace checks a grace of secs seconds: from 0 to keystore.MaxGrace.
func keyGrace(secs int) (time.Duration, error) {
	maxSecs := int(keystore.MaxGrace / time.Second)
	if secs < 0 || secs > maxSecs {
		return 0, apperr.Invalid("grace_seconds", "must be an integer from 0 to %d", maxSecs)
	}
	return time.Duration(secs) * time.Second, nil
}
