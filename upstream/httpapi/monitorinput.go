package httpapi

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// decodeMonitorWrite decodes a POST or PATCH body strictly. It is one JSON object of
// writable fields, each of the right type and range. null is never a valid value. The
// read-only id, created_at and updated_at may be sent back, and are ignored. The first
// problem, in body order, is an EINVALID error naming its field. Whether target suits
// type is checked later, when both are known (store.CheckTarget).
func decodeMonitorWrite(body []byte) (store.MonitorWrite, error) {
	return decodeObjectInto(body, "", nil, func(w *store.MonitorWrite, name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			w.Name, err = present(decodeText(name, raw, 1, store.MaxNameLen))
		case "type":
			w.Type, err = present(decodeString(name, raw))
			if err == nil && !slices.Contains(store.MonitorTypes, *w.Type) {
				err = apperr.Invalid(name, "must be one of %s", strings.Join(store.MonitorTypes, ", "))
			}
		case "target":
			w.Target, err = present(decodeText(name, raw, 1, store.MaxTargetLen))
		case "interval_seconds":
			w.IntervalSeconds, err = present(decodeInt(name, raw))
			if err == nil && (*w.IntervalSeconds < store.MinInterval || *w.IntervalSeconds > store.MaxInterval) {
				err = apperr.Invalid(name, "must be from %d to %d", store.MinInterval, store.MaxInterval)
			}
		case "locations":
			w.Locations, err = decodeLocations(name, raw)
		case "paused":
			w.Paused, err = present(decodeBool(name, raw))
		case "config":
			w.Config, err = decodeFreeJSON(name, raw, '{')
		case "assertions":
			w.Assertions, err = decodeFreeJSON(name, raw, '[')
		case "id", "created_at", "updated_at":
			// Read-only fields, which clients may send back as they read them.
		default:
			err = apperr.Invalid(name, "unknown field")
		}
		return err
	})
}

// present returns a pointer to v, the decoded value of a member the body sets, and
// err. A MonitorWrite's nil pointer is a member the body leaves out.
func present[T any](v T, err error) (*T, error) {
	return &v, err
}

// decodeLocations decodes a non-empty array of distinct known locations.
func decodeLocations(name string, raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, apperr.Invalid(name, "must be an array of strings, not %s", kindOf(raw))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, apperr.Invalid(name, "must be an array of strings")
	}
	if len(elems) == 0 {
		return nil, apperr.Invalid(name, "must not be empty")
	}
	locs := make([]string, 0, len(elems))
	for _, e := range elems {
		loc, err := decodeString(name, e)
		if err != nil {
			return nil, apperr.Invalid(name, "must be an array of strings")
		}
		if !slices.Contains(store.MonitorLocations, loc) {
			return nil, apperr.Invalid(name, "unknown location %q; known: %s", loc, strings.Join(store.MonitorLocations, ", "))
		}
		if slices.Contains(locs, loc) {
			return nil, apperr.Invalid(name, "lists %s more than once", loc)
		}
		locs = append(locs, loc)
	}
	return locs, nil
}
