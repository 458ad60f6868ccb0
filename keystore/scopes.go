package keystore

import "slices"

// A key's scopes narrow what its role allows: a key with scopes may do only what both
// its role and one of its scopes allow, and a key without scopes (nil) whatever its
// role allows. A scope never widens a role (docs/security.md, Scopes).

// FieldScopes is the name of a key's scopes, as the API and the audit trail spell it.
const FieldScopes = "scopes"

// The scopes a key may carry.
const (
	ScopeMonitorsRead   = "monitors:read"
	ScopeMonitorsWrite  = "monitors:write"
	ScopeMonitorsDelete = "monitors:delete"
)

// Scopes is the vocabulary of scopes, in the order keys list them. Every program that
// writes or shows a key's scopes reads it here. Callers must not modify it.
var Scopes = []string{ScopeMonitorsRead, ScopeMonitorsWrite, ScopeMonitorsDelete}

// KnownScope reports whether s is one of Scopes.
func KnownScope(s string) bool {
	return slices.Contains(Scopes, s)
}

// ParseScopes checks a key's scopes as a person gave them: a non-empty list of
// distinct scopes of Scopes. It returns them in the order of Scopes, so that two
// lists of the same scopes are equal. A nil list is unscoped and stays nil; an empty
// one is refused, since a key that may do nothing is a mistake rather than a choice.
func ParseScopes(list []string) ([]string, error) {
	if list == nil {
		return nil, nil
	}
	if err := checkScopes(list); err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list))
	for _, s := range Scopes {
		if slices.Contains(list, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// checkScopes checks a list of scopes: nil, or non-empty, each known, none twice.
func checkScopes(list []string) error {
	if list == nil {
		return nil
	}
	if len(list) == 0 {
		return invalidSetting(FieldScopes, "must list at least one scope, or be null for everything the role allows")
	}
	for i, s := range list {
		if !KnownScope(s) {
			return invalidSetting(FieldScopes, "%q is not a scope: use %s", s, scopeWords())
		}
		if slices.Contains(list[:i], s) {
			return invalidSetting(FieldScopes, "lists %s more than once", s)
		}
	}
	return nil
}

// scopeWords is the vocabulary as a message lists it: "a, b or c".
func scopeWords() string {
	out := ""
	for i, s := range Scopes {
		switch {
		case i == 0:
		case i == len(Scopes)-1:
			out += " or "
		default:
			out += ", "
		}
		out += s
	}
	return out
}
