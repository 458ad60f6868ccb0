// Package health is the Caddy module keygate_health: the gateway's health for load
// balancers. It answers from what the breakers of the process's v1_gateway handlers
// know of PostgreSQL and Redis (conns.Health), without a key and without a request to
// /v1. Package caddymodule imports it, so a Caddy built with caddymodule has it.
package health

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/caddymodule/placement"
)

func init() {
	caddy.RegisterModule(Health{})
	httpcaddyfile.RegisterHandlerDirective("keygate_health", parseCaddyfile)
	httpcaddyfile.RegisterDirectiveOrder("keygate_health", httpcaddyfile.Before, "respond")
}

// PingEvery is the least time between two pings of a dependency that no request has
// used meanwhile. A gateway without traffic learns that its PostgreSQL or Redis went
// away from the health checks themselves, at most this long plus a ping's budget
// after the fact.
const PingEvery = time.Second

// Health is the module keygate_health. It answers every request:
//
//   - 200 {"status":"ok"} while every v1_gateway handler of the process can check
//     keys: PostgreSQL answers and, with redis_url, Redis does, and their circuit
//     breakers are closed (what keygate_dependency_up says);
//   - 503 {"status":"unavailable","down":["postgres"]} naming each dependency down
//     otherwise, or not yet known to answer;
//   - 503 {"status":"unavailable","down":[],"reason":"no_gateway"} when no
//     v1_gateway handler is loaded in the process.
//
// It waits on nothing: a dependency no request has used for PingEvery is pinged in
// the background, and the next health check has its answer.
//
//	handle /healthz {
//		keygate_health
//	}
type Health struct{}

// CaddyModule returns the Caddy module information.
func (Health) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.keygate_health",
		New: func() caddy.Module { return new(Health) },
	}
}

// Provision warns when the handler is under no path matcher.
func (Health) Provision(ctx caddy.Context) error {
	placement.WarnUnmatched(ctx, "keygate_health", "handle /healthz { … }")
	return nil
}

// unavailable is the body of a 503.
type unavailable struct {
	Status string   `json:"status"` // "unavailable"
	Down   []string `json:"down"`
	Reason string   `json:"reason,omitempty"`
}

// ServeHTTP answers with the process's health. A HEAD gets the status alone.
func (Health) ServeHTTP(w http.ResponseWriter, r *http.Request, _ caddyhttp.Handler) error {
	status, body := http.StatusOK, []byte(`{"status":"ok"}`)
	if down, watching := conns.Health(PingEvery); !watching || len(down) > 0 {
		a := unavailable{Status: "unavailable", Down: down}
		if !watching {
			a.Down, a.Reason = []string{}, "no_gateway"
		}
		status = http.StatusServiceUnavailable
		var err error
		if body, err = json.Marshal(a); err != nil {
			return err
		}
	}
	hdr := w.Header()
	hdr.Set("Content-Type", "application/json")
	hdr.Set("Content-Length", strconv.Itoa(len(body)))
	hdr.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	if r.Method != http.MethodHead {
		_, _ = w.Write(body)
	}
	return nil
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	keygate_health
//
// It takes no argument and no block.
func (Health) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr()
	}
	if d.NextBlock(0) {
		return d.Err("keygate_health takes no block")
	}
	return nil
}

func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	var m Health
	err := m.UnmarshalCaddyfile(h.Dispenser)
	return m, err
}

// Interface guards
var (
	_ caddy.Provisioner           = Health{}
	_ caddyhttp.MiddlewareHandler = Health{}
	_ caddyfile.Unmarshaler       = Health{}
)
