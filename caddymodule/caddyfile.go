package caddymodule

import (
	"math"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/dustin/go-humanize"
	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/caddymodule/routetable"
)

func init() {
	httpcaddyfile.RegisterHandlerDirective("v1_gateway", parseCaddyfile)
	// Ordered like an authentication handler, so that a Caddyfile works without a
	// global `order` option; an explicit `order v1_gateway before reverse_proxy`
	// still takes precedence.
	httpcaddyfile.RegisterDirectiveOrder("v1_gateway", httpcaddyfile.Before, "reverse_proxy")
}

// parseCaddyfile sets up the handler from Caddyfile tokens.
func parseCaddyfile(h httpcaddyfile.Helper) (caddyhttp.MiddlewareHandler, error) {
	g := new(Handler)
	err := g.UnmarshalCaddyfile(h.Dispenser)
	return g, err
}

// UnmarshalCaddyfile sets up the handler from Caddyfile tokens. Syntax:
//
//	v1_gateway [<matcher>] {
//	    database_url     <url>
//	    database_read_urls <url...>
//	    database_read_max_lag <duration>
//	    redis_url        <url>
//	    redis_mode       single|cluster|sentinel
//	    redis_tls_ca     <pem file>
//	    key_prefix       <prefix>
//	    legacy_keys      accept|reject
//	    gateway_secret   <secret>
//	    identity_key     <pem file>
//	    identity_audience <name>
//	    strip_fields     <name...>
//	    limiter_failure  open|closed|local
//	    database_timeout <duration>
//	    redis_timeout    <duration>
//	    database_dial_timeout <duration>
//	    redis_dial_timeout    <duration>
//	    database_min_conns    <n>
//	    redis_min_conns       <n>
//	    lookup_lanes     <n>
//	    batch_linger     <duration>
//	    disable_lookup_batching
//	    disable_count_pipelining
//	    disable_metrics
//	    last_used_interval <duration>|off
//	    usage_flush_interval <duration>
//	    usage_buffer     <rows>
//	    usage            on|off
//	    route <methods> <path> [scope <scope>] [cost <n>]
//	    max_request_body <size>
//	}
//
// database_url and gateway_secret (or identity_key) are required, typically as {env.DATABASE_URL} and
// {env.GATEWAY_SECRET}. strip_fields takes one or more names and may be repeated; the
// names of all its lines together replace the default list. route may be repeated:
// its lines, in order, replace the whole built-in route table; methods are
// comma-separated (GET,HEAD) or *. database_read_urls takes one or more URLs and may
// appear once. Every other option takes exactly one argument and may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr() // options go in the block
	}

	usageGiven := false // usage on leaves no trace in the Handler
	for nesting := d.Nesting(); d.NextBlock(nesting); {
		var err error
		switch opt := d.Val(); opt {
		case "database_url":
			h.DatabaseURL, err = oneArg(d, h.DatabaseURL != "")
		case "database_read_urls":
			if h.DatabaseReadURLs != nil {
				return d.Errf("database_read_urls already specified")
			}
			if h.DatabaseReadURLs = d.RemainingArgs(); len(h.DatabaseReadURLs) == 0 {
				return d.ArgErr()
			}
		case "database_read_max_lag":
			err = durationArg(d, &h.DatabaseReadMaxLag)
		case "redis_url":
			if h.RedisURL, err = oneArg(d, h.RedisURL != ""); err == nil {
				err = checkRedisMode(d, h.RedisMode, h.RedisURL)
			}
		case "redis_mode":
			if h.RedisMode, err = oneArg(d, h.RedisMode != ""); err != nil {
				break
			}
			if h.RedisMode != conns.RedisSingle && h.RedisMode != conns.RedisCluster && h.RedisMode != conns.RedisSentinel {
				return d.Errf("redis_mode must be single, cluster or sentinel, not %q", h.RedisMode)
			}
			err = checkRedisMode(d, h.RedisMode, h.RedisURL)
		case "redis_tls_ca":
			h.RedisTLSCA, err = oneArg(d, h.RedisTLSCA != "")
		case "key_prefix":
			h.KeyPrefix, err = oneArg(d, h.KeyPrefix != "")
		case "legacy_keys":
			if h.LegacyKeys, err = oneArg(d, h.LegacyKeys != ""); err == nil && h.LegacyKeys != legacyKeysAccept && h.LegacyKeys != legacyKeysReject {
				return d.Errf("legacy_keys must be accept or reject, not %q", h.LegacyKeys)
			}
		case "last_used_interval":
			err = lastUsedIntervalArg(d, &h.LastUsedInterval)
		case "usage_flush_interval":
			if err = durationArg(d, &h.UsageFlushInterval); err == nil && h.UsageFlushInterval < caddy.Duration(minUsageFlushInterval) {
				return d.Errf("usage_flush_interval must be at least %s", minUsageFlushInterval)
			}
		case "max_request_body":
			err = sizeArg(d, &h.MaxRequestBody)
		case "usage_buffer":
			err = positiveIntArg(d, &h.UsageBuffer)
		case "usage":
			err = usageArg(d, &h.DisableUsage, &usageGiven)
		case "gateway_secret":
			h.GatewaySecret, err = oneArg(d, h.GatewaySecret != "")
		case "identity_key":
			h.IdentityKey, err = oneArg(d, h.IdentityKey != "")
		case "identity_audience":
			h.IdentityAudience, err = oneArg(d, h.IdentityAudience != "")
		case "route":
			var r Route
			if r, err = routeArgs(d); err == nil {
				h.Routes = append(h.Routes, r)
			}
		case "strip_fields":
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.ArgErr()
			}
			h.StripFields = append(h.StripFields, names...)
		case "limiter_failure":
			if h.LimiterFailure, err = oneArg(d, h.LimiterFailure != ""); err != nil {
				break
			}
			if _, ok := parseLimiterFailure(h.LimiterFailure); !ok {
				return d.Errf("limiter_failure must be open, closed or local, not %q", h.LimiterFailure)
			}
		case "database_timeout":
			err = durationArg(d, &h.DatabaseTimeout)
		case "redis_timeout":
			err = durationArg(d, &h.RedisTimeout)
		case "database_dial_timeout":
			err = durationArg(d, &h.DatabaseDialTimeout)
		case "redis_dial_timeout":
			err = durationArg(d, &h.RedisDialTimeout)
		case "database_min_conns":
			err = positiveIntArg(d, &h.DatabaseMinConns)
		case "redis_min_conns":
			err = positiveIntArg(d, &h.RedisMinConns)
		case "lookup_lanes":
			err = positiveIntArg(d, &h.LookupLanes)
		case "batch_linger":
			err = durationArg(d, &h.BatchLinger)
		case "disable_lookup_batching":
			err = flagArg(d, &h.DisableLookupBatching)
		case "disable_count_pipelining":
			err = flagArg(d, &h.DisableCountPipelining)
		case "disable_metrics":
			err = flagArg(d, &h.DisableMetrics)
		default:
			return d.Errf("unrecognized subdirective %s", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// oneArg returns the one argument of the option the dispenser is on; given tells
// whether the option already appeared.
func oneArg(d *caddyfile.Dispenser, given bool) (string, error) {
	opt := d.Val()
	var arg string
	if !d.Args(&arg) || d.NextArg() {
		return "", d.ArgErr()
	}
	if given {
		return "", d.Errf("%s already specified", opt)
	}
	return arg, nil
}

// routeArgs reads a route line: methods, a path pattern, then scope and cost, each
// at most once, in either order.
func routeArgs(d *caddyfile.Dispenser) (Route, error) {
	args := d.RemainingArgs()
	if len(args) < 2 || len(args)%2 != 0 {
		return Route{}, d.ArgErr()
	}
	r := Route{Path: args[1]}
	if args[0] != "*" {
		r.Methods = strings.Split(args[0], ",")
	}
	for i := 2; i < len(args); i += 2 {
		switch k, v := args[i], args[i+1]; k {
		case "scope":
			if r.Scope != "" {
				return Route{}, d.Errf("route %s %s: scope already specified", args[0], args[1])
			}
			r.Scope = v
		case "cost":
			if r.Cost != 0 {
				return Route{}, d.Errf("route %s %s: cost already specified", args[0], args[1])
			}
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return Route{}, d.Errf("route %s %s: cost must be a whole number from 1 to %d, not %q", args[0], args[1], routetable.MaxCost, v)
			}
			r.Cost = n
		default:
			return Route{}, d.Errf("route %s %s: unrecognized %q (scope or cost)", args[0], args[1], k)
		}
	}
	if err := routetable.Check(r); err != nil {
		return Route{}, d.Err(err.Error())
	}
	return r, nil
}

// positiveIntArg reads the one positive whole number of the option the dispenser is on.
func positiveIntArg(d *caddyfile.Dispenser, dst *int) error {
	opt := d.Val()
	arg, err := oneArg(d, *dst != 0)
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(arg)
	if err != nil || n <= 0 {
		return d.Errf("%s must be a positive whole number, not %q", opt, arg)
	}
	*dst = n
	return nil
}

// sizeArg reads the one positive size of the option the dispenser is on, in bytes
// or with a unit as go-humanize reads it (1MiB, 512KB).
func sizeArg(d *caddyfile.Dispenser, dst *int64) error {
	opt := d.Val()
	arg, err := oneArg(d, *dst != 0)
	if err != nil {
		return err
	}
	n, err := humanize.ParseBytes(arg)
	if err != nil || n == 0 || n > math.MaxInt64 {
		return d.Errf("%s must be a positive size such as 1MiB, not %q", opt, arg)
	}
	*dst = int64(n)
	return nil
}

// durationArg reads the one positive duration of the option the dispenser is on.
func durationArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	opt := d.Val()
	arg, err := oneArg(d, *dst != 0)
	if err != nil {
		return err
	}
	dur, err := caddy.ParseDuration(arg)
	if err != nil {
		return d.Errf("parsing %s: %v", opt, err)
	}
	if dur <= 0 {
		return d.Errf("%s must be positive", opt)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// lastUsedIntervalArg reads last_used_interval: off (stored as -1) or a duration of at
// least minLastUsedInterval.
func lastUsedIntervalArg(d *caddyfile.Dispenser, dst *caddy.Duration) error {
	arg, err := oneArg(d, *dst != 0)
	if err != nil {
		return err
	}
	if arg == "off" {
		*dst = -1
		return nil
	}
	dur, err := caddy.ParseDuration(arg)
	if err != nil {
		return d.Errf("parsing last_used_interval: %v", err)
	}
	if dur < minLastUsedInterval {
		return d.Errf("last_used_interval must be at least %s, or off", minLastUsedInterval)
	}
	*dst = caddy.Duration(dur)
	return nil
}

// usageArg reads usage: on (the default) or off, which sets disable.
func usageArg(d *caddyfile.Dispenser, disable, given *bool) error {
	arg, err := oneArg(d, *given)
	if err != nil {
		return err
	}
	if arg != "on" && arg != "off" {
		return d.Errf("usage must be on or off, not %q", arg)
	}
	*disable, *given = arg == "off", true
	return nil
}

// flagArg sets a switch that takes no argument.
func flagArg(d *caddyfile.Dispenser, dst *bool) error {
	opt := d.Val()
	if d.NextArg() {
		return d.ArgErr()
	}
	if *dst {
		return d.Errf("%s already specified", opt)
	}
	*dst = true
	return nil
}

// checkRedisMode reports a redis_url that cannot work in mode, so that the Caddyfile
// error names the line: a sentinel URL without master_name. A URL with placeholders
// is checked in Provision, once they are replaced.
func checkRedisMode(d *caddyfile.Dispenser, mode, url string) error {
	if mode != conns.RedisSentinel || url == "" || strings.Contains(url, "{") {
		return nil
	}
	opts, err := redis.ParseFailoverURL(url)
	if err != nil {
		return d.Errf("redis_url (sentinel): %v", err)
	}
	if opts.MasterName == "" {
		return d.Err("redis_mode sentinel needs ?master_name=<name> in redis_url")
	}
	return nil
}
