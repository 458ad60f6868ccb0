// Package placement warns about placements of keygate's handlers that Caddy accepts
// and that fail quietly on every request. Provision calls it, so `caddy validate`,
// which provisions, shows the warning. Where a handler sits is read from the config
// Caddy is provisioning: the server's routes, and the subroutes around the handler.
package placement

import (
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/rewrite"
	"go.uber.org/zap"
)

// routeLevel is one route list on the way from a server to the handler being
// provisioned, with the index of the route in it that leads there.
type routeLevel struct {
	routes caddyhttp.RouteList
	i      int
}

// placement returns the route lists from the server down to the handler ctx is
// provisioning, outermost first. ok is false where it cannot tell. That is a handler
// outside the server's primary routes (an error or named route), or inside a handler
// that is not a subroute.
func placement(ctx caddy.Context) (levels []routeLevel, ok bool) {
	if ctx.Context == nil { // a handler provisioned outside Caddy, by a test
		return nil, false
	}
	srv, _ := ctx.Value(caddyhttp.ServerCtxKey).(*caddyhttp.Server)
	mods := ctx.Modules() // the http app, the subroutes, then the handler itself
	if srv == nil || len(mods) < 2 {
		return nil, false
	}
	if _, isApp := mods[0].(*caddyhttp.App); !isApp {
		return nil, false
	}
	lists := []caddyhttp.RouteList{srv.Routes}
	for _, m := range mods[1 : len(mods)-1] {
		sr, isSubroute := m.(*caddyhttp.Subroute)
		if !isSubroute {
			return nil, false
		}
		lists = append(lists, sr.Routes)
	}
	for _, routes := range lists {
		i := provisioning(routes)
		if i < 0 {
			return nil, false
		}
		levels = append(levels, routeLevel{routes, i})
	}
	return levels, true
}

// provisioning returns the index of the route of routes whose handlers Caddy is
// provisioning, or -1. Caddy provisions a list's handlers in order, and clears a
// route's HandlersRaw once they are loaded.
func provisioning(routes caddyhttp.RouteList) int {
	for i := range routes {
		if routes[i].HandlersRaw != nil {
			return i
		}
	}
	return -1
}

// WarnUnmatched warns when the handler named handler is under no path matcher. It
// would answer every request that reaches it, the dashboard's and /v1's, with its
// own answer. where is the block to place it in.
func WarnUnmatched(ctx caddy.Context, handler, where string) {
	levels, ok := placement(ctx)
	if !ok {
		return
	}
	for _, l := range levels {
		if matchesPath(l.routes[l.i]) {
			return
		}
	}
	ctx.Logger().Warn(handler + " is under no path matcher, so it answers every request that reaches it; " +
		"place it in `" + where + "`")
}

// matchesPath reports whether every matcher set of r constrains the path.
func matchesPath(r caddyhttp.Route) bool {
	if len(r.MatcherSets) == 0 {
		return false
	}
	for _, set := range r.MatcherSets {
		path := false
		for _, m := range set {
			switch m.(type) {
			case *caddyhttp.MatchPath, caddyhttp.MatchPath, *caddyhttp.MatchPathRE, *caddyhttp.MatchExpression:
				path = true
			}
		}
		if !path {
			return false
		}
	}
	return true
}

// WarnStrippedPath warns when a rewrite before v1_gateway strips /v1 from the path,
// as `handle_path /v1/*` does. The module and the upstream need the full path. /v1/me
// would go to the upstream as /me, and every proxied path would answer 404.
func WarnStrippedPath(ctx caddy.Context, logger *zap.Logger) {
	levels, _ := placement(ctx)
	for _, l := range levels {
		for _, r := range l.routes[:l.i] {
			for _, h := range r.Handlers {
				rw, ok := h.(*rewrite.Rewrite)
				if ok && strings.HasSuffix(strings.TrimSuffix(rw.StripPathPrefix, "/"), "/v1") {
					logger.Warn("v1_gateway is under a rewrite that strips /v1 from the path (handle_path?): "+
						"it and the upstream need the full path, so /v1/me and every proxied path would answer 404; use `handle /v1/*`",
						zap.String("strip_path_prefix", rw.StripPathPrefix))
					return
				}
			}
		}
	}
}
