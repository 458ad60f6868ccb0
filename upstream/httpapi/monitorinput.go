package httpapi

import (
	"encoding/json"
	"slices"
	"strings"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// decodeMonitorWrite decodes a POST or PATCH body strictly: one JSON object whose
// members are the writable fields, each of the right type and range (null is never a
// valid value), or the read-only id, created_at and updated_at, which are ignored. The
// first problem, in body order, is an EINVALID error naming its field. How target
// relates to type is checked later (store.CheckTarget), when both are known.
func decodeMonitorWrite(body []byte) (store.MonitorWrite, error) {
	var w store.MonitorWrite
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			var v string
			v, err = decodeText(name, raw, 1, store.MaxNameLen)
			w.Name = &v
		case "type":
			var v string
			v, err = decodeString(name, raw)
			if err == nil && !slices.Contains(store.MonitorTypes, v) {
				err = apperr.Invalid(name, "must be one of %s", strings.Join(store.MonitorTypes, ", "))
			}
			w.Type = &v
		case "target":
			var v string
			v, err = decodeText(name, raw, 1, store.MaxTargetLen)
			w.Target = &v
		case "interval_seconds":
			var v int
			v, err = decodeInt(name, raw)
			if err == nil && (v < store.MinInterval || v > store.MaxInterval) {
				err = apperr.Invalid(name, "must be from %d to %d", store.MinInterval, store.MaxInterval)
			}
			w.IntervalSeconds = &v
		case "locations":
			w.Locations, err = decodeLocations(name, raw)
		case "paused":
			var v bool
			v, err = decodeBool(name, raw)
			w.Paused = &v
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
	if err != nil {
		return store.MonitorWrite{}, err
	}
	return w, nil
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
