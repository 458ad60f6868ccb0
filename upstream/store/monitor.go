package store

import (
	"encoding/json"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/keygate/keygate/upstream/apperr"
)

// The values a monitor's fields may take, and the defaults of a create.
var (
	// MonitorTypes are the check types a monitor may have.
	MonitorTypes = []string{"http", "tcp", "dns", "icmp"}
	// MonitorLocations are the probe locations a monitor may run from.
	MonitorLocations = []string{"us-east", "us-west", "eu-west", "eu-central", "ap-southeast"}
)

const (
	defaultInterval = 300
	// MinInterval and MaxInterval bound interval_seconds, in seconds.
	MinInterval = 10
	MaxInterval = 86400
	// MaxNameLen and MaxTargetLen are the longest name and target, in characters.
	MaxNameLen   = 200
	MaxTargetLen = 2048
)

var defaultLocations = []string{"us-east"}

// MonitorWrite is a monitor write, decoded from a request body. A nil field is one the
// body does not set. Config and Assertions hold JSON that PostgreSQL's jsonb can store.
// They are json.RawMessage so that pgx sends them as JSON text in every query exec
// mode. A []byte would go as bytea ('\x7b7d') where pgx does not prepare the statement
// first. Those are the modes exec and simple_protocol, for PgBouncer's transaction
// pooling.
type MonitorWrite struct {
	Name            *string
	Type            *string
	Target          *string
	IntervalSeconds *int
	Locations       []string
	Paused          *bool
	Config          json.RawMessage
	Assertions      json.RawMessage
}

// empty reports whether w sets no field at all.
func (w MonitorWrite) empty() bool {
	return w.Name == nil && w.Type == nil && w.Target == nil && w.IntervalSeconds == nil &&
		w.Locations == nil && w.Paused == nil && w.Config == nil && w.Assertions == nil
}

// ForCreate checks that w can create a monitor. Name, type and target are required,
// and target must suit type. The other fields, when left out, take their defaults.
func (w MonitorWrite) ForCreate() (MonitorWrite, error) {
	switch {
	case w.Name == nil:
		return w, apperr.Invalid("name", "required")
	case w.Type == nil:
		return w, apperr.Invalid("type", "required")
	case w.Target == nil:
		return w, apperr.Invalid("target", "required")
	}
	if w.IntervalSeconds == nil {
		v := defaultInterval
		w.IntervalSeconds = &v
	}
	if w.Locations == nil {
		w.Locations = slices.Clone(defaultLocations)
	}
	if w.Paused == nil {
		v := false
		w.Paused = &v
	}
	if w.Config == nil {
		w.Config = []byte("{}")
	}
	if w.Assertions == nil {
		w.Assertions = []byte("[]")
	}
	return w, CheckTarget(*w.Type, *w.Target)
}

// CheckTarget checks that target suits a monitor of type typ:
//
//   - http: an absolute http or https URL with a host (a hostname or an IP address)
//     and, if given, a port from 1 to 65535;
//   - tcp: host:port, host a hostname or an IP address (IPv6 in brackets), port 1..65535;
//   - dns: a hostname (a name to resolve, so not an IP address);
//   - icmp: a hostname or an IP address.
//
// A hostname has at most 253 characters, and an optional final dot. Its labels are
// separated by dots. A label has 1 to 63 letters, digits and hyphens, with no hyphen at
// either end. The last label is not all digits. Internationalised names are given in
// punycode. No target contains white space.
func CheckTarget(typ, target string) error {
	if strings.IndexFunc(target, unicode.IsSpace) >= 0 {
		return apperr.Invalid("target", "must not contain white space")
	}
	switch typ {
	case "http":
		u, err := url.Parse(target)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Opaque != "" || u.Host == "" ||
			!validHost(u.Hostname()) || (u.Port() != "" && !validPort(u.Port())) {
			return apperr.Invalid("target", "must be an absolute http or https URL with a host for type http")
		}
	case "tcp":
		host, port, err := net.SplitHostPort(target)
		if err != nil || !validHost(host) || !validPort(port) {
			return apperr.Invalid("target", "must be host:port with a port from 1 to 65535 for type tcp")
		}
	case "dns":
		if !validHostname(target) {
			return apperr.Invalid("target", "must be a hostname for type dns")
		}
	case "icmp":
		if !validHost(target) {
			return apperr.Invalid("target", "must be a hostname or an IP address for type icmp")
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

// validHostname reports whether s is a hostname as CheckTarget describes it.
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

// ValidUUID reports whether s is a UUID in its canonical textual form: 8-4-4-4-12
// hexadecimal digits of either case.
func ValidUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}
