package httpapi

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strconv"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// The inputs of a key's creation and roll. The API's JSON body and the dashboard's
// form decode into the same types. The two decoders share the check of each field. So
// a bad value gets the same message at both doors.

// createKeyInput is what a key's creation takes (createKey).
type createKeyInput struct {
	Name      string
	Role      keystore.Role
	ExpiresAt *time.Time // nil: the key lives until revoked
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
		default:
			err = apperr.Invalid(name, "unknown field")
		}
		return err
	})
}

// createKeyForm reads the dashboard's create form. Its fields are checked in the order
// expires_at, name, role. An empty expires_at means the key never expires.
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
	return in, nil
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
