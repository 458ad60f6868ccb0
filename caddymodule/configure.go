package caddymodule

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/net/http/httpguts"

	"github.com/keygate/keygate/caddymodule/routetable"
	"github.com/keygate/keygate/fieldstrip"
	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
)

// This file holds what Provision does before it takes a pool: the options' defaults,
// their placeholders, and the state derived from them; and Validate, which checks the
// options once they are applied.

// Defaults of the options.
const (
	defaultDatabaseTimeout = 2 * time.Second
	defaultReadMaxLag      = time.Second
	defaultRedisTimeout    = 200 * time.Millisecond
	defaultLookupLanes     = 1
	defaultDialTimeout     = 5 * time.Second
	// defaultRedisMinConns covers the pipelined rounds that overlap while Redis is
	// slow (docs/dependencies.md, A floor of warm connections).
	defaultRedisMinConns = 10
	// lookupOverflow is how many batches of key lookups may be in flight beside the
	// lanes' while PostgreSQL is slow. A batch that has waited a tenth of
	// database_timeout for a lane goes out on its own (keystore.Batcher). The default
	// floor of connections covers them (docs/dependencies.md, A floor of warm
	// connections).
	lookupOverflow   = 9
	legacyKeysAccept = "accept"
	legacyKeysReject = "reject"
)

// defaultStripFields are the monitor fields /v1 never returns (README.md, the
// decision order's step 7).
var defaultStripFields = []string{"config", "assertions", "config_version", "paused_reason", "org_id", "deleted_at"}

// configure is Provision without the pools. It applies the defaults, replaces the
// placeholders, checks the options (Validate) and builds the state that needs no
// dependency. Tests call it to build a handler without servers.
func (h *Handler) configure(logger *zap.Logger) error {
	h.logger = logger
	h.floodLog = h.logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 1, 0)
	}))

	h.applyDefaults()

	// ReplaceKnown, not ReplaceAll: a password with braces in it is not a
	// placeholder and must survive.
	repl := caddy.NewReplacer()
	h.databaseURL = repl.ReplaceKnown(h.DatabaseURL, "")
	h.redisURL = repl.ReplaceKnown(h.RedisURL, "")
	h.readURLs = nil
	for _, u := range h.DatabaseReadURLs {
		h.readURLs = append(h.readURLs, repl.ReplaceKnown(u, ""))
	}
	h.secret = repl.ReplaceKnown(h.GatewaySecret, "")
	identityKey := repl.ReplaceKnown(h.IdentityKey, "")

	if err := h.Validate(); err != nil {
		return err
	}
	h.format, _ = keystore.NewFormat(h.KeyPrefix) // valid: checked by Validate
	if h.LegacyKeys == legacyKeysReject {
		h.format = h.format.RejectingLegacy()
	}
	h.fields = fieldstrip.NewFields(h.StripFields)
	h.routes = routetable.New(h.Routes)
	h.failMode, _ = parseLimiterFailure(h.LimiterFailure) // valid: checked by Validate
	if identityKey != "" {
		priv, err := gatewayauth.ReadPrivateKey(identityKey)
		if err != nil {
			return fmt.Errorf("identity_key: %v", err)
		}
		if h.signer, err = gatewayauth.NewSigner(priv, h.IdentityAudience); err != nil {
			return fmt.Errorf("identity_key: %v", err)
		}
	} else if h.IdentityKey != "" {
		return fmt.Errorf("identity_key %q is empty once its placeholders are replaced (is the environment variable set?)", h.IdentityKey)
	}
	h.refusedLog = h.upstreamRefusedLog()
	for _, name := range defaultStripFields {
		if !slices.Contains(h.StripFields, name) {
			h.logger.Warn("strip_fields leaves out a default field; /v1 responses will carry it",
				zap.String("field", name))
		}
	}
	return nil
}

// applyDefaults gives every option left unset its default (see Handler).
func (h *Handler) applyDefaults() {
	if h.KeyPrefix == "" {
		h.KeyPrefix = keystore.DefaultPrefix
	}
	if h.LimiterFailure == "" {
		h.LimiterFailure = failOpen.String()
	}
	if h.DatabaseTimeout == 0 {
		h.DatabaseTimeout = caddy.Duration(defaultDatabaseTimeout)
	}
	if h.DatabaseReadMaxLag == 0 {
		h.DatabaseReadMaxLag = caddy.Duration(defaultReadMaxLag)
	}
	if h.RedisTimeout == 0 {
		h.RedisTimeout = caddy.Duration(defaultRedisTimeout)
	}
	if h.Routes == nil {
		h.Routes = slices.Clone(routetable.Builtin)
	}
	if h.MaxRequestBody == 0 {
		h.MaxRequestBody = defaultMaxRequestBody
	}
	if h.StripFields == nil {
		h.StripFields = slices.Clone(defaultStripFields)
	}
	if h.LookupLanes == 0 {
		h.LookupLanes = defaultLookupLanes
	}
	if h.DatabaseDialTimeout == 0 {
		h.DatabaseDialTimeout = caddy.Duration(defaultDialTimeout)
	}
	if h.RedisDialTimeout == 0 {
		h.RedisDialTimeout = caddy.Duration(defaultDialTimeout)
	}
	if h.DatabaseMinConns == 0 {
		h.DatabaseMinConns = h.LookupLanes + lookupOverflow + 1
		if h.DisableLookupBatching {
			h.DatabaseMinConns = 4
		}
	}
	if h.RedisMinConns == 0 {
		h.RedisMinConns = defaultRedisMinConns
	}
	if h.LegacyKeys == "" {
		h.LegacyKeys = legacyKeysAccept
	}
	if h.LastUsedInterval == 0 {
		h.LastUsedInterval = caddy.Duration(keystore.DefaultLastUsedInterval)
	}
	if h.UsageFlushInterval == 0 {
		h.UsageFlushInterval = caddy.Duration(keystore.DefaultUsageInterval)
	}
	if h.UsageBuffer == 0 {
		h.UsageBuffer = keystore.DefaultUsageMaxPending
	}
	if h.IdentityAudience == "" {
		h.IdentityAudience = gatewayauth.DefaultAudience
	}
}

// Validate checks the options. Caddy calls it after Provision, which has applied the
// defaults and replaced the placeholders, so it sees the values in use. It is fast
// and dials nothing.
func (h *Handler) Validate() error {
	if h.DatabaseURL == "" {
		return errors.New("database_url is required")
	}
	if strings.TrimSpace(h.databaseURL) == "" {
		return fmt.Errorf("database_url %q is empty once its placeholders are replaced (is the environment variable set?)", h.DatabaseURL)
	}
	if err := h.validateReads(); err != nil {
		return err
	}
	if h.RedisURL != "" && strings.TrimSpace(h.redisURL) == "" {
		return fmt.Errorf("redis_url %q is empty once its placeholders are replaced (is the environment variable set?); remove redis_url to count in-process", h.RedisURL)
	}
	if h.GatewaySecret == "" && h.IdentityKey == "" {
		return errors.New("gateway_secret or identity_key is required: the upstream refuses /v1 requests without one")
	}
	if h.secret == "" && h.IdentityKey == "" {
		return fmt.Errorf("gateway_secret %q is empty once its placeholders are replaced (is the environment variable set?)", h.GatewaySecret)
	}
	if h.secret != "" && (!httpguts.ValidHeaderFieldValue(h.secret) || strings.TrimSpace(h.secret) != h.secret) {
		return errors.New("gateway_secret must be a valid header value: no control characters, no leading or trailing whitespace")
	}
	if !keystore.ValidPrefix(h.KeyPrefix) {
		return fmt.Errorf("key_prefix %q: must match [a-z][a-z0-9]{0,15}", h.KeyPrefix)
	}
	if _, ok := parseLimiterFailure(h.LimiterFailure); !ok {
		return fmt.Errorf("limiter_failure %q: must be open, closed or local", h.LimiterFailure)
	}
	if h.DatabaseTimeout < 0 {
		return fmt.Errorf("database_timeout %s: must be positive", time.Duration(h.DatabaseTimeout))
	}
	if h.RedisTimeout < 0 {
		return fmt.Errorf("redis_timeout %s: must be positive", time.Duration(h.RedisTimeout))
	}
	if h.DatabaseDialTimeout < 0 {
		return fmt.Errorf("database_dial_timeout %s: must be positive", time.Duration(h.DatabaseDialTimeout))
	}
	if h.RedisDialTimeout < 0 {
		return fmt.Errorf("redis_dial_timeout %s: must be positive", time.Duration(h.RedisDialTimeout))
	}
	if h.DatabaseMinConns < 0 {
		return fmt.Errorf("database_min_conns %d: must be positive", h.DatabaseMinConns)
	}
	if h.RedisMinConns < 0 {
		return fmt.Errorf("redis_min_conns %d: must be positive", h.RedisMinConns)
	}
	if h.LookupLanes < 0 {
		return fmt.Errorf("lookup_lanes %d: must be positive", h.LookupLanes)
	}
	if linger := time.Duration(h.BatchLinger); linger < 0 || 10*linger > time.Duration(min(h.DatabaseTimeout, h.RedisTimeout)) {
		return fmt.Errorf("batch_linger %s: must be at most a tenth of database_timeout (%s) and of redis_timeout (%s)",
			linger, time.Duration(h.DatabaseTimeout), time.Duration(h.RedisTimeout))
	}
	if h.LegacyKeys != legacyKeysAccept && h.LegacyKeys != legacyKeysReject {
		return fmt.Errorf("legacy_keys %q: must be accept or reject", h.LegacyKeys)
	}
	if h.LastUsedInterval > 0 && time.Duration(h.LastUsedInterval) < minLastUsedInterval {
		return fmt.Errorf("last_used_interval %s: must be at least %s, or off", time.Duration(h.LastUsedInterval), minLastUsedInterval)
	}
	if time.Duration(h.UsageFlushInterval) < minUsageFlushInterval {
		return fmt.Errorf("usage_flush_interval %s: must be at least %s", time.Duration(h.UsageFlushInterval), minUsageFlushInterval)
	}
	if h.MaxRequestBody < 0 {
		return fmt.Errorf("max_request_body %d: must be positive", h.MaxRequestBody)
	}
	if h.UsageBuffer < 0 {
		return fmt.Errorf("usage_buffer %d: must be positive", h.UsageBuffer)
	}
	if len(h.StripFields) == 0 {
		return errors.New("strip_fields: at least one name is required")
	}
	for _, name := range h.StripFields {
		if name == "" {
			return errors.New("strip_fields: names must not be empty")
		}
	}
	for _, r := range h.Routes {
		if err := routetable.Check(r); err != nil {
			return err
		}
	}
	return nil
}
