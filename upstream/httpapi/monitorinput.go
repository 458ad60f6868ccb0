package upstream

import (
	"encoding/json"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// The values a monitor's fields may take (CONTRACT §6), and the defaults of a create.
var (
	monitorTypes     = []string{"http", "tcp", "dns", "icmp"}
	monitorLocations = []string{"us-east", "us-west", "eu-west", "eu-central", "ap-southeast"}
)

const (
	defaultInterval = 300
	minInterval     = 10
	maxInterval     = 86400
	maxNameLen      = 200
	maxTargetLen    = 2048
)

var defaultLocations = []string{"us-east"}

// monitorWrite is a decoded monitor write body. A nil field is one the body does not
// set; config and assertions hold JSON re-encoded by decodeFreeJSON, typed
// json.RawMessage so that pgx sends them as JSON text in every query exec mode: a
// []byte would go as bytea ('\x7b7d') where pgx does not prepare the statement first
// (exec and simple_protocol, the modes for PgBouncer's transaction pooling).
type monitorWrite struct {
	name            *string
	typ             *string
	target          *string
	intervalSeconds *int
	locations       []string
	paused          *bool
	config          json.RawMessage
	assertions      json.RawMessage
}

// empty reports whether w sets no field at all.
func (w monitorWrite) empty() bool {
	return w.name == nil && w.typ == nil && w.target == nil && w.intervalSeconds == nil &&
		w.locations == nil && w.paused == nil && w.config == nil && w.assertions == nil
}

// decodeMonitorWrite decodes a POST or PATCH body strictly: one JSON object whose
// members are the writable fields, each of the right type and range (null is never a
// valid value), or the read-only id, created_at and updated_at, which are ignored. The
// first problem, in body order, is an EINVALID error naming its field. How target
// relates to type is checked later (checkTarget), when both are known.
func decodeMonitorWrite(body []byte) (monitorWrite, error) {
	var w monitorWrite
	err := decodeObject(body, func(name string, raw json.RawMessage) error {
		var err error
		switch name {
		case "name":
			var v string
			v, err = decodeText(name, raw, 1, maxNameLen)
			w.name = &v
		case "type":
			var v string
			v, err = decodeString(name, raw)
			if err == nil && !slices.Contains(monitorTypes, v) {
				err = invalid(name, "must be one of %s", strings.Join(monitorTypes, ", "))
			}
			w.typ = &v
		case "target":
			var v string
			v, err = decodeText(name, raw, 1, maxTargetLen)
			w.target = &v
		case "interval_seconds":
			var v int
			v, err = decodeInt(name, raw)
			if err == nil && (v < minInterval || v > maxInterval) {
				err = invalid(name, "must be from %d to %d", minInterval, maxInterval)
			}
			w.intervalSeconds = &v
		case "locations":
			w.locations, err = decodeLocations(name, raw)
		case "paused":
			var v bool
			v, err = decodeBool(name, raw)
			w.paused = &v
		case "config":
			w.config, err = decodeFreeJSON(name, raw, '{')
		case "assertions":
			w.assertions, err = decodeFreeJSON(name, raw, '[')
		case "id", "created_at", "updated_at":
			// Read-only fields, which clients may send back as they read them.
		default:
			err = invalid(name, "unknown field")
		}
		return err
	})
	if err != nil {
		return monitorWrite{}, err
	}
	return w, nil
}

// decodeLocations decodes a non-empty array of distinct known locations.
func decodeLocations(name string, raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || raw[0] != '[' {
		return nil, invalid(name, "must be an array of strings, not %s", kindOf(raw))
	}
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		return nil, invalid(name, "must be an array of strings")
	}
	if len(elems) == 0 {
		return nil, invalid(name, "must not be empty")
	}
	locs := make([]string, 0, len(elems))
	for _, e := range elems {
		loc, err := decodeString(name, e)
		if err != nil {
			return nil, invalid(name, "must be an array of strings")
		}
		if !slices.Contains(monitorLocations, loc) {
			return nil, invalid(name, "unknown location %q; known: %s", loc, strings.Join(monitorLocations, ", "))
		}
		if slices.Contains(locs, loc) {
			return nil, invalid(name, "lists %s more than once", loc)
		}
		locs = append(locs, loc)
	}
	return locs, nil
}

// forCreate checks that w can create a monitor: name, type and target are required,
// interval_seconds and locations take their defaults, and target must suit type.
func (w monitorWrite) forCreate() (monitorWrite, error) {
	switch {
	case w.name == nil:
		return w, invalid("name", "required")
	case w.typ == nil:
		return w, invalid("type", "required")
	case w.target == nil:
		return w, invalid("target", "required")
	}
	if w.intervalSeconds == nil {
		v := defaultInterval
		w.intervalSeconds = &v
	}
	if w.locations == nil {
		w.locations = slices.Clone(defaultLocations)
	}
	if w.paused == nil {
		v := false
		w.paused = &v
	}
	if w.config == nil {
		w.config = []byte("{}")
	}
	if w.assertions == nil {
		w.assertions = []byte("[]")
	}
	return w, checkTarget(*w.typ, *w.target)
}

// checkTarget checks that target suits a monitor of type typ:
//
//   - http: an absolute http or https URL with a host (a hostname or an IP address)
//     and, if given, a port from 1 to 65535;
//   - tcp: host:port, host a hostname or an IP address (IPv6 in brackets), port 1..65535;
//   - dns: a hostname (a name to resolve, so not an IP address);
//   - icmp: a hostname or an IP address.
//
// A hostname is at most 253 characters of dot-separated labels of 1 to 63 letters,
// digits and hyphens, neither starting nor ending with a hyphen, with an optional final
// dot; its last label is not all digits. Internationalised names are given in punycode.
// No target contains white space.
func checkTarget(typ, target string) error {
	if strings.IndexFunc(target, unicode.IsSpace) >= 0 {
		return invalid("target", "must not contain white space")
	}
	switch typ {
	case "http":
		u, err := url.Parse(target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "" || u.Host == "" ||
			!validHost(u.Hostname()) || (u.Port() != "" && !validPort(u.Port())) {
			return invalid("target", "must be an absolute http or https URL with a host for type http")
		}
	case "tcp":
		host, port, err := net.SplitHostPort(target)
		if err != nil || !validHost(host) || !validPort(port) {
			return invalid("target", "must be host:port with a port from 1 to 65535 for type tcp")
		}
	case "dns":
		if !validHostname(target) {
			return invalid("target", "must be a hostname for type dns")
		}
	case "icmp":
		if !validHost(target) {
			return invalid("target", "must be a hostname or an IP address for type icmp")
		}
	}
	return nil
}

// validHost reports whether s is a hostname or an IP address without zone.
func validHost(s string) bool {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Zone() == ""
	}
	return validHostname(s)
}

// validHostname reports whether s is a hostname as checkTarget describes it.
func validHostname(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.IndexFunc(last, func(r rune) bool { return r < '0' || r > '9' }) >= 0
}

// validPort reports whether s is a decimal port from 1 to 65535.
func validPort(s string) bool {
	if s == "" || s[0] < '0' || s[0] > '9' {
		return false
	}
	n, err := strconv.Atoi(s)
	return err == nil && n >= 1 && n <= 65535
}
