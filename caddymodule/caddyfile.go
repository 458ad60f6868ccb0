package caddymodule

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"github.com/redis/go-redis/v9"
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
//	    redis_url        <url>
//	    redis_mode       single|cluster|sentinel
//	    redis_tls_ca     <pem file>
//	    key_prefix       <prefix>
//	    gateway_secret   <secret>
//	    strip_fields     <name...>
//	    limiter_failure  open|closed|local
//	    database_timeout <duration>
//	    redis_timeout    <duration>
//	    lookup_lanes     <n>
//	    disable_lookup_batching
//	    disable_count_pipelining
//	    disable_metrics
//	}
//
// database_url and gateway_secret are required, typically as {env.DATABASE_URL} and
// {env.GATEWAY_SECRET}. strip_fields takes one or more names and may be repeated; the
// names of all its lines together replace the default list. Every other option takes
// exactly one argument and may appear once.
func (h *Handler) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume directive name
	if d.NextArg() {
		return d.ArgErr() // options go in the block
	}

	for nesting := d.Nesting(); d.NextBlock(nesting); {
		opt := d.Val()
		switch opt {
		case "disable_lookup_batching", "disable_count_pipelining", "disable_metrics":
			if d.NextArg() {
				return d.ArgErr()
			}
			target := &h.DisableLookupBatching
			switch opt {
			case "disable_count_pipelining":
				target = &h.DisableCountPipelining
			case "disable_metrics":
				target = &h.DisableMetrics
			}
			if *target {
				return d.Errf("%s already specified", opt)
			}
			*target = true
			continue
		}
		if opt == "strip_fields" {
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.ArgErr()
			}
			if h.StripFields == nil {
				h.StripFields = make([]string, 0, len(names))
			}
			h.StripFields = append(h.StripFields, names...)
			continue
		}

		var arg string
		if !d.Args(&arg) {
			return d.ArgErr()
		}
		if d.NextArg() {
			return d.ArgErr()
		}
		switch opt {
		case "database_url":
			if h.DatabaseURL != "" {
				return d.Err("database_url already specified")
			}
			h.DatabaseURL = arg
		case "redis_url":
			if h.RedisURL != "" {
				return d.Err("redis_url already specified")
			}
			h.RedisURL = arg
			if err := checkRedisMode(h.RedisMode, h.RedisURL); err != nil {
				return d.Err(err.Error())
			}
		case "redis_mode":
			if h.RedisMode != "" {
				return d.Err("redis_mode already specified")
			}
			if arg != redisModeSingle && arg != redisModeCluster && arg != redisModeSentinel {
				return d.Errf("redis_mode must be single, cluster or sentinel, not %q", arg)
			}
			h.RedisMode = arg
			if err := checkRedisMode(h.RedisMode, h.RedisURL); err != nil {
				return d.Err(err.Error())
			}
		case "redis_tls_ca":
			if h.RedisTLSCA != "" {
				return d.Err("redis_tls_ca already specified")
			}
			h.RedisTLSCA = arg
		case "key_prefix":
			if h.KeyPrefix != "" {
				return d.Err("key_prefix already specified")
			}
			h.KeyPrefix = arg
		case "gateway_secret":
			if h.GatewaySecret != "" {
				return d.Err("gateway_secret already specified")
			}
			h.GatewaySecret = arg
		case "limiter_failure":
			if h.LimiterFailure != "" {
				return d.Err("limiter_failure already specified")
			}
			if !validLimiterFailure(arg) {
				return d.Errf("limiter_failure must be open, closed or local, not %q", arg)
			}
			h.LimiterFailure = arg
		case "database_timeout", "redis_timeout":
			dur, err := caddy.ParseDuration(arg)
			if err != nil {
				return d.Errf("parsing %s: %v", opt, err)
			}
			if dur <= 0 {
				return d.Errf("%s must be positive", opt)
			}
			target := &h.DatabaseTimeout
			if opt == "redis_timeout" {
				target = &h.RedisTimeout
			}
			if *target != 0 {
				return d.Errf("%s already specified", opt)
			}
			*target = caddy.Duration(dur)
		case "lookup_lanes":
			if h.LookupLanes != 0 {
				return d.Err("lookup_lanes already specified")
			}
			n, err := strconv.Atoi(arg)
			if err != nil || n <= 0 {
				return d.Errf("lookup_lanes must be a positive whole number, not %q", arg)
			}
			h.LookupLanes = n
		default:
			return d.Errf("unrecognized subdirective %s", opt)
		}
	}
	return nil
}

// checkRedisMode reports a redis_url that cannot work in mode, so that the Caddyfile
// error names the line: a sentinel URL without master_name. A URL with placeholders
// is checked in Provision, once they are replaced.
func checkRedisMode(mode, url string) error {
	if mode != redisModeSentinel || url == "" || strings.Contains(url, "{") {
		return nil
	}
	opts, err := redis.ParseFailoverURL(url)
	if err != nil {
		return fmt.Errorf("redis_url (sentinel): %v", err)
	}
	if opts.MasterName == "" {
		return errors.New("redis_mode sentinel needs ?master_name=<name> in redis_url")
	}
	return nil
}
