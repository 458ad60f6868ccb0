// Package keystore creates, lists, revokes and verifies keygate's API keys, which live
// in PostgreSQL. It knows nothing of HTTP or Caddy. The upstream service uses it for
// the dashboard's key routes. The gateway uses it to check every /v1 request.
//
// A full key is <prefix>_live_<keyId>.<secret> (README.md, Keys). Only SHA-256 of the
// secret is stored. The full key exists in memory once, when it is created.
//
// A Reader has hot standbys answer the lookups, fenced on the primary's WAL position
// so that a revocation still applies on the next request (docs/operations.md,
// Standbys).
//
// Verify keeps "rejected" apart from "broken". An unknown, revoked, expired or
// mismatching key is (Key{}, false, nil). A database that cannot answer is
// (Key{}, false, err). The first is a 401, the second a 503.
package keystore

import (
	"net/netip"
	"time"
)

// Role is the role a key is bound to for its whole life.
type Role string

// The roles a key can have.
const (
	RoleAdmin  Role = "Admin"
	RoleEditor Role = "Editor"
	RoleViewer Role = "Viewer"
)

// Valid reports whether r is one of the key roles.
func (r Role) Valid() bool {
	return r == RoleAdmin || r == RoleEditor || r == RoleViewer
}

// Key is what a verified key resolves to.
type Key struct {
	// ID is the key's keyId.
	ID string
	// OrgID is the UUID of the key's organisation.
	OrgID string
	// Role is the key's role.
	Role Role
	// RateLimit is the key's minute limit at the lookup: its plan's api_rate_limit,
	// or the key's own rate_limit when that is smaller. 0 no API access, N requests a
	// minute, -1 unlimited.
	RateLimit int
	// Windows are the key's limits in its windows beside its minute at the lookup, by
	// Window: its plan's, or the key's own when that is smaller. -1: none.
	Windows [NumWindows]int
	// OrgRateLimit is the plan's org_rate_limit: requests a minute across all the
	// organisation's keys. -1: none.
	OrgRateLimit int
	// MonthlyQuota is the plan's api_requests_per_month: requests a UTC calendar month
	// across all the organisation's keys. -1: none.
	MonthlyQuota int64
	// AllowedCIDRs are the networks the key may be used from; empty: anywhere.
	AllowedCIDRs []netip.Prefix
	// Scopes are the key's scopes, in the order of the package's Scopes; nil:
	// everything its role allows. A scope never widens the role: a request needs its
	// route's scope as well (docs/configuration.md, Scopes and route costs).
	Scopes []string
}

// AllowsAddr reports whether a request from addr may use k: k has no allowed
// networks, or one of them holds addr. An IPv4-mapped IPv6 address counts as its
// IPv4 one, since stored networks are never IPv4-mapped (ParseAllowedCIDRs).
func (k *Key) AllowsAddr(addr netip.Addr) bool {
	if len(k.AllowedCIDRs) == 0 {
		return true
	}
	addr = addr.Unmap()
	for _, p := range k.AllowedCIDRs {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// Record is a key as the dashboard shows it: never its secret nor its hash.
type Record struct {
	ID        string
	OrgID     string
	Name      string
	Role      Role
	CreatedAt time.Time
	ExpiresAt *time.Time
	RevokedAt *time.Time
	// LastUsedAt is when a gateway last flushed a use of the key (see LastUsed). It is
	// nil if none did.
	LastUsedAt *time.Time
	// RateLimit is the key's own requests a minute; nil: its plan's api_rate_limit.
	// The gateway applies the smaller of the two.
	RateLimit *int
	// WindowLimits are the key's own limits in its windows beside its minute; nil
	// each: its plan's. The gateway applies the smaller of the two.
	WindowLimits WindowLimits
	// AllowedCIDRs are the networks the key may be used from, in canonical form; empty:
	// anywhere.
	AllowedCIDRs []netip.Prefix
	// Scopes are the key's scopes, in the order of the package's Scopes; nil:
	// everything its role allows.
	Scopes []string
}

// NewKey is what a person supplies to create a key.
type NewKey struct {
	OrgID string
	Name  string
	Role  Role
	// ExpiresAt is optional: a key without it lives until revoked.
	ExpiresAt *time.Time
	// CreatedBy is the id of the user creating the key, and the actor of its
	// key.created audit event. It is optional: a key made by a program, without a
	// user, is not audited.
	CreatedBy string
	// RateLimit is optional: the key's own requests a minute, from 1 to its plan's
	// api_rate_limit (any positive number on an unlimited plan). Nil: the plan's.
	RateLimit *int
	// WindowLimits are optional: the key's own limits in its windows beside its
	// minute, each from 1 to its plan's (any positive number where the plan has none).
	// Nil each: the plan's.
	WindowLimits WindowLimits
	// AllowedCIDRs is optional: the networks the key may be used from, at most
	// MaxAllowedCIDRs, each as ParseCIDR returns it. Empty: anywhere.
	AllowedCIDRs []netip.Prefix
	// Scopes is optional: the key's scopes, as ParseScopes returns them. Nil:
	// everything its role allows.
	Scopes []string
}
