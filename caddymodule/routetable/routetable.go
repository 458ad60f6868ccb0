// Package routetable is the gateway's route table: which scope a request needs and
// what it costs (docs/configuration.md, Scopes and route costs). Its rules match as
// Caddy's path matcher does; the rest of the package knows nothing of Caddy. A request
// is matched once, before the budgets count it with its rule's cost; a scoped key is
// decided on the same match after the role (Route.Allows).
package routetable

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/keygate/keygate/keystore"
)

// Rule is one rule of the route table, as configured: the requests it matches, the
// scope a scoped key needs for them, and what each weighs against every budget.
type Rule struct {
	// Methods are the HTTP methods the rule matches, in upper case. "*" or none:
	// every method. A rule naming GET matches HEAD too: a service answers a HEAD
	// with its GET handler.
	Methods []string `json:"methods,omitempty"`
	// Path is a path pattern, read as Caddy's path matcher reads one: case-insensitive,
	// on the cleaned path, "*" at the end a prefix match, at the start a suffix match,
	// elsewhere a glob. Required.
	Path string `json:"path"`
	// Scope is the scope a scoped key needs for the rule's requests, one of the
	// upstream's vocabulary (`upstream scope list`), which this package cannot see.
	// Default: none (any key whose role allows the method)
	Scope string `json:"scope,omitempty"`
	// Cost is how many units each of the rule's requests counts against the key's
	// minute, the organisation's minute and its month, from 1 to MaxCost. Default: 1
	Cost int `json:"cost,omitempty"`
}

// MaxCost is the most a rule's requests may cost. A budget counts up to it many
// times over without leaving the range Redis's scripts count in exactly.
const MaxCost = 1_000_000

// UnmarshalJSON reads a rule of the JSON config. A cost given as 0 is refused, as
// below 1: left out, the cost is 1.
func (r *Rule) UnmarshalJSON(b []byte) error {
	type plain Rule
	var in struct {
		*plain
		Cost *int `json:"cost"`
	}
	in.plain = (*plain)(r)
	if err := json.Unmarshal(b, &in); err != nil {
		return err
	}
	if in.Cost != nil {
		if *in.Cost < 1 {
			return costError(*r, *in.Cost)
		}
		r.Cost = *in.Cost
	}
	return nil
}

// costError is the error of a rule whose cost is out of range.
func costError(r Rule, cost int) error {
	return fmt.Errorf("route %s %s: cost %d must be from 1 to %d", strings.Join(r.Methods, ","), r.Path, cost, MaxCost)
}

// Builtin is the table of /v1 when the config names no route
// (docs/configuration.md, Scopes and route costs). GET /v1/me needs no scope whatever
// the table says.
var Builtin = []Rule{
	{Methods: []string{"GET", "HEAD"}, Path: "/v1/monitors", Scope: "monitors:read"},
	{Methods: []string{"GET", "HEAD"}, Path: "/v1/monitors/*", Scope: "monitors:read"},
	{Methods: []string{"POST"}, Path: "/v1/monitors", Scope: "monitors:write"},
	{Methods: []string{"PATCH"}, Path: "/v1/monitors/*", Scope: "monitors:write"},
	{Methods: []string{"DELETE"}, Path: "/v1/monitors/*", Scope: "monitors:delete"},
	{Methods: []string{"GET", "HEAD"}, Path: "/v1/me"},
}

// routeMethods are the methods a rule may name, each a bit of a route's method set.
var routeMethods = []string{
	http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch,
	http.MethodDelete, http.MethodOptions, http.MethodConnect, http.MethodTrace,
}

// Check returns what is wrong with r, or nil.
func Check(r Rule) error {
	if strings.TrimSpace(r.Path) == "" {
		return fmt.Errorf("route %v %q: the path pattern is empty", r.Methods, r.Path)
	}
	for _, m := range r.Methods {
		if m != "*" && !slices.Contains(routeMethods, m) {
			return fmt.Errorf("route %s %s: unknown method %q (one of %s, or *)", strings.Join(r.Methods, ","), r.Path, m, strings.Join(routeMethods, ", "))
		}
	}
	if r.Scope != "" && !keystore.ValidScopeName(r.Scope) {
		return fmt.Errorf("route %s %s: scope %q must match %s, at most %d characters", strings.Join(r.Methods, ","), r.Path, r.Scope,
			keystore.ScopeNamePattern, keystore.MaxScopeLen)
	}
	if r.Cost < 0 || r.Cost > MaxCost {
		return costError(r, r.Cost)
	}
	return nil
}

// Route is a Rule as the request path uses it. A nil *Route is a request no rule
// matched.
type Route struct {
	methods uint16 // a bit per routeMethods index; all set for any method
	pattern string // lower case
	shape   shape  // of pattern, decided once
	lit     string // pattern without the stars its shape names
	caddy   caddyhttp.MatchPath
	scope   string
	cost    int
}

// shape is how a pattern matches, as Caddy's path matcher reads it.
type shape uint8

const (
	shapeGlob     shape = iota // path.Match
	shapeAny                   // "*"
	shapePrefix                // "/v1/monitors/*"
	shapeSuffix                // "*.json"
	shapeContains              // "*/monitors/*"
)

// shapeOf returns the shape of a lower-case pattern and the literal it compares.
func shapeOf(pattern string) (shape, string) {
	if pattern == "*" {
		return shapeAny, ""
	}
	switch n := strings.Count(pattern, "*"); {
	case n == 2 && pattern[0] == '*' && pattern[len(pattern)-1] == '*':
		return shapeContains, pattern[1 : len(pattern)-1]
	case n == 1 && pattern[0] == '*':
		return shapeSuffix, pattern[1:]
	case n == 1 && pattern[len(pattern)-1] == '*':
		return shapePrefix, pattern[:len(pattern)-1]
	}
	return shapeGlob, pattern
}

// Table is the rules in order, and what lets most requests skip them.
type Table struct {
	rules []Route
	// Weighed is whether some rule costs more than 1: without one, an unscoped key's
	// request is counted as 1 without matching.
	Weighed bool
}

// New builds the table of rules, which Check has passed.
func New(rules []Rule) *Table {
	t := &Table{rules: make([]Route, len(rules))}
	for i, r := range rules {
		rt := Route{pattern: strings.ToLower(r.Path), scope: r.Scope, cost: max(r.Cost, 1)}
		rt.shape, rt.lit = shapeOf(rt.pattern)
		for _, m := range r.Methods {
			if m == "*" {
				rt.methods = ^uint16(0)
				continue
			}
			rt.methods |= 1 << slices.Index(routeMethods, m)
			if m == http.MethodGet {
				rt.methods |= 1 << slices.Index(routeMethods, http.MethodHead)
			}
		}
		if len(r.Methods) == 0 {
			rt.methods = ^uint16(0)
		}
		if needsCaddy(r.Path) {
			rt.caddy = caddyhttp.MatchPath{r.Path}
			_ = rt.caddy.Provision(caddy.Context{}) // lower-cases; never fails
		}
		t.Weighed = t.Weighed || rt.cost > 1
		t.rules[i] = rt
	}
	return t
}

// needsCaddy reports whether a pattern uses what only Caddy's matcher reads: a
// placeholder, an escape sequence or a doubled slash. The others are matched here, as
// Caddy does, on a path lower-cased and cleaned once for all of them.
func needsCaddy(pattern string) bool {
	return strings.ContainsAny(pattern, "{%") || strings.Contains(pattern, "//")
}

// Match returns the first rule matching r, or nil.
func (t *Table) Match(r *http.Request) *Route {
	bit := uint16(1) << 15 // a method no rule names matches only rules of any method
	if i := slices.Index(routeMethods, r.Method); i >= 0 {
		bit = 1 << i
	}
	var cleaned string // r's path lower-cased and cleaned, once a rule needs it
	for i := range t.rules {
		rt := &t.rules[i]
		if rt.methods&bit == 0 {
			continue
		}
		if rt.caddy != nil {
			if matchCaddy(rt.caddy, r) {
				return rt
			}
			continue
		}
		if cleaned == "" {
			cleaned = cleanPath(strings.ToLower(r.URL.Path))
		}
		if rt.matches(cleaned) {
			return rt
		}
	}
	return nil
}

// matchCaddy runs Caddy's path matcher, which needs the request's replacer.
func matchCaddy(m caddyhttp.MatchPath, r *http.Request) bool {
	if _, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer); !ok {
		return false
	}
	return m.Match(r)
}

// cleanPath is path.Clean keeping a trailing slash, as Caddy's path matcher cleans.
func cleanPath(p string) string {
	c := path.Clean(p)
	if c != "/" && strings.HasSuffix(p, "/") {
		c += "/"
	}
	return c
}

// matches matches the rule's pattern, without placeholders, escapes or doubled slashes,
// against a cleaned, lower-cased path, as Caddy's path matcher does.
func (rt *Route) matches(p string) bool {
	switch rt.shape {
	case shapeAny:
		return true
	case shapePrefix:
		return strings.HasPrefix(p, rt.lit)
	case shapeSuffix:
		return strings.HasSuffix(p, rt.lit)
	case shapeContains:
		return strings.Contains(p, rt.lit)
	}
	ok, _ := path.Match(rt.lit, p)
	return ok
}

// Cost is what a request matching rt weighs: its rule's cost, or 1 where no rule
// matched.
func (rt *Route) Cost() int {
	if rt == nil {
		return 1
	}
	return rt.cost
}

// Allows reports whether a key with scopes may make a request matching rt (nil: no
// rule matched), and the scope it lacks. An unscoped key (nil scopes) is bounded by
// its role alone. A scoped key needs the rule's scope; on a route no rule names, it is
// refused: deny by default.
func (rt *Route) Allows(scopes []string) (ok bool, missing string) {
	switch {
	case scopes == nil:
		return true, ""
	case rt == nil:
		return false, ""
	case rt.scope == "" || slices.Contains(scopes, rt.scope):
		return true, ""
	}
	return false, rt.scope
}
