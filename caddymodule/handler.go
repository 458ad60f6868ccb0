// Package caddymodule is the Caddy module v1_gateway (http.handlers.v1_gateway): the
// public /v1 API contract enforced at the edge. For every request it checks the API
// key against PostgreSQL, the organisation's API access, a per-key rate limit and the
// key's role, answers GET /v1/me itself, and hands everything else to the next
// handler (the reverse proxy to the upstream) with the caller's identity asserted in
// X-Gateway-* headers, filtering the fields named in strip_fields out of every JSON
// response.
package caddymodule

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/net/http/httpguts"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Defaults of the options.
const (
	defaultDatabaseTimeout = 2 * time.Second
	defaultRedisTimeout    = 200 * time.Millisecond
	defaultLookupLanes     = 1
	defaultDialTimeout     = 5 * time.Second
	// defaultRedisMinConns covers the pipelined rounds that overlap while Redis is
	// slow: a round goes out at most a tenth of redis_timeout after the one before.
	defaultRedisMinConns = 10
	// lookupOverflow is how many batches of key lookups may be in flight beside the
	// lanes' while PostgreSQL is slow: a batch that has waited a tenth of
	// database_timeout for a lane goes out on its own (keystore.Batcher), so up to nine
	// overlap while each still answers within the timeout. The default floor of
	// connections covers them, so that none of them opens a connection on its
	// requests' time.
	lookupOverflow       = 9
	limiterFailureOpen   = "open"
	limiterFailureClosed = "closed"
	limiterFailureLocal  = "local"
	legacyKeysAccept     = "accept"
	legacyKeysReject     = "reject"
)

// defaultStripFields are the monitor fields never returned on /v1 (spec §2.3).
var defaultStripFields = []string{"config", "assertions", "config_version", "paused_reason", "org_id", "deleted_at"}

// Handler is the v1_gateway handler: the whole /v1 contract at the edge. It decides
// in the order of CONTRACT §2 (credentials, the key, API access, the rate limit, the
// role, GET /v1/me, the proxy), and the first that applies answers; ServeHTTP numbers
// the steps.
//
// The module expects to see full paths: use it under `handle /v1/*`, not
// `handle_path /v1/*` (which strips the prefix, so that /v1/me would not be
// recognised and the upstream would get paths without /v1).
//
// A PostgreSQL that fails or is slower than database_timeout answers 503
// service_unavailable, never 401 and never lets a request through. A Redis that fails
// is decided by limiter_failure. After a few failures in a row, a circuit breaker per
// dependency stops waiting on it: the same answers come at once, and one request at a
// time probes whether it is back (see breaker). An upstream that is down or times out answers 502
// bad_gateway or 504 gateway_timeout. Every error the module answers is
// application/json with a string field "error".
//
// The module sets the placeholders {http.auth.user.id} (the key id, which Caddy's
// access log shows as user_id), {http.auth.user.org_id} and {http.auth.user.role}.
type Handler struct {
	// DatabaseURL is the postgres:// URL of the database holding the API keys and
	// plans, queried on every request. Placeholders such as {env.DATABASE_URL} are
	// replaced when the config is loaded. pgxpool's URL parameters tune the pool,
	// for example pool_max_conns=32 (pgxpool's default is 4 or the number of CPUs,
	// whichever is greater). The pool is shared by every handler with the same URL
	// and survives config reloads. Required.
	DatabaseURL string `json:"database_url,omitempty"`

	// RedisURL is the redis:// (or rediss://) URL of the Redis counting requests per
	// key, shared by every gateway instance using it, so that a key has one budget
	// however many instances serve it. Placeholders are replaced at load. Without it,
	// counts are kept in this process only, which is right for a single instance.
	// Default: none (in-process counts)
	RedisURL string `json:"redis_url,omitempty"`

	// RedisMode is how redis_url is read: "single" (one server, go-redis ParseURL),
	// "cluster" (Redis Cluster seed nodes, ParseClusterURL) or "sentinel" (Sentinel
	// addresses with ?master_name=, ParseFailoverURL). Default: single
	RedisMode string `json:"redis_mode,omitempty"`

	// RedisTLSCA is a PEM file of the CAs a rediss:// server certificate must chain
	// to, in every redis_mode. Default: the system roots
	RedisTLSCA string `json:"redis_tls_ca,omitempty"`

	// KeyPrefix is the prefix of the API keys, the <key_prefix> of
	// <key_prefix>_live_<keyId>.<secret>; it must match [a-z][a-z0-9]{0,15}.
	// Default: mon
	KeyPrefix string `json:"key_prefix,omitempty"`

	// LegacyKeys is what happens to a key made before secrets carried a checksum
	// (docs/security.md, Keys): "accept" looks it up as any other key, so that every
	// made-up key of that shape costs a query; "reject" answers it the one 401 without
	// a database query. Keys with a checksum are checked before any query either way:
	// a wrong checksum is the 401 at once.
	// Default: accept
	LegacyKeys string `json:"legacy_keys,omitempty"`

	// GatewaySecret is sent to the upstream in X-Gateway-Secret on every proxied
	// request; an upstream with GATEWAY_SECRET refuses /v1 requests without it.
	// Placeholders such as {env.GATEWAY_SECRET} are replaced at load. Required unless
	// identity_key is set; with identity_key, an empty one (an unset variable) is
	// not sent.
	GatewaySecret string `json:"gateway_secret,omitempty"`

	// IdentityKey is a PEM file of an Ed25519 private key (PKCS#8, as `openssl genpkey
	// -algorithm ed25519` writes it). With it, every proxied request carries
	// X-Gateway-Identity: an EdDSA-signed JWT of the key id (sub), org_id and role, for
	// identity_audience, valid for a minute, which upstreams verify with the public key
	// (package gatewayauth, and v1_gateway_jwks to publish it). An assertion is signed
	// once per key, org and role and reused for half its lifetime. Placeholders are
	// replaced at load. Default: none (no assertion)
	IdentityKey string `json:"identity_key,omitempty"`

	// IdentityAudience is the aud of the identity assertions: the upstreams they are
	// meant for. Default: keygate-upstream
	IdentityAudience string `json:"identity_audience,omitempty"`

	// StripFields are the member names removed from every JSON response of the
	// upstream, at any depth (in objects, in arrays, in objects in arrays …),
	// whatever the response's Content-Type says if its body is JSON. Names are
	// matched after JSON escapes are decoded and case-insensitively, as Go's
	// encoding/json matches member names to fields ("Config" is config). Setting it
	// replaces the default list; name the defaults again to keep them.
	// Default: config assertions config_version paused_reason org_id deleted_at
	StripFields []string `json:"strip_fields,omitempty"`

	// LimiterFailure is what happens to a request of a rate-limited key while Redis
	// cannot count it (unreachable, hung, or slower than redis_timeout): "open" lets it
	// through without RateLimit headers, "closed" answers 503 service_unavailable,
	// "local" counts it in this process against the same limit, with RateLimit
	// headers and 429s as usual. A local count is a budget per gateway instance: with
	// n instances a key may get up to n times its limit while Redis is down, and the
	// local counts start from zero (they know nothing of what Redis counted).
	// Default: open
	LimiterFailure string `json:"limiter_failure,omitempty"`

	// DatabaseTimeout bounds the key lookup of a request, including waiting for and
	// dialing a connection; a lookup that takes longer answers 503
	// service_unavailable. Default: 2s
	DatabaseTimeout caddy.Duration `json:"database_timeout,omitempty"`

	// RedisTimeout bounds the rate-limit count of a request in Redis (dial, pool
	// wait, write and read, with no retry); a count that takes longer is a limiter
	// failure, decided by limiter_failure. Default: 200ms
	RedisTimeout caddy.Duration `json:"redis_timeout,omitempty"`

	// DatabaseDialTimeout bounds opening a PostgreSQL connection (TCP, TLS, startup
	// and authentication) and, separately, preparing its lookups. Opening runs on
	// this budget, not on a request's: a connection a request asked for still joins
	// the pool when that request has given up (see warm.go), so a database slow to
	// connect to is slow once, not on every request. The URL's connect_timeout, when
	// set, wins. Default: 5s
	DatabaseDialTimeout caddy.Duration `json:"database_dial_timeout,omitempty"`

	// DatabaseMinConns is the floor of PostgreSQL connections the pool keeps open and
	// prepared, so that requests find them ready: a batch that finds none idle waits
	// for a new one to open, several round trips. The pool grows to it unless the
	// URL sets a smaller pool_max_conns; the URL's pool_min_conns, when larger, wins.
	// Default: lookup_lanes + 10 (the lanes' queries, up to nine batches that went out
	// on their own while PostgreSQL is slow, and the last_used_at and usage writes),
	// or 4 with disable_lookup_batching
	DatabaseMinConns int `json:"database_min_conns,omitempty"`

	// RedisDialTimeout bounds opening a Redis connection (TCP, TLS, HELLO/AUTH, CLIENT
	// SETINFO) by the warmer that keeps redis_min_conns open, and the limiter's
	// preparation (loading its scripts, reading Redis's clock) at start and in the
	// breaker's probe. None of that runs on a request's deadline. Default: 5s
	RedisDialTimeout caddy.Duration `json:"redis_dial_timeout,omitempty"`

	// RedisMinConns is the floor of Redis connections kept open and greeted, in each
	// primary's pool on a Cluster, topped up a few times a second on a goroutine of its
	// own (see warm.go). It covers the pipelined rounds that overlap while Redis is
	// slow. Default: 10
	RedisMinConns int `json:"redis_min_conns,omitempty"`

	// LookupLanes is how many batched key lookups may be in flight at once. Concurrent
	// requests share one query (keystore.Batcher) that is sent as soon as a lane is
	// free; a request only ever joins a query not yet sent, so every answer still
	// comes from a query that started after the request arrived. One lane makes the
	// largest batches, which suited a 2-core machine best (docs/performance.md). Default: 1
	LookupLanes int `json:"lookup_lanes,omitempty"`

	// BatchLinger lets a batch of key lookups or a round of counts started while
	// requests come fast (at least four per BatchLinger) wait for more: it goes out
	// once requests pause or BatchLinger after its first, or at once when it holds as
	// many as lingering batches gathered of late (a closed loop of a few clients all
	// in it), and lingering stops while it gathers too little (internal/gather,
	// Options.Linger). Fewer, larger round trips cost the gateway, PostgreSQL and
	// Redis less CPU per request, for up to twice BatchLinger of latency (lookup and
	// count). Freshness holds: a request still only joins a round trip not yet sent.
	// At most a tenth of database_timeout and of redis_timeout (docs/performance.md).
	// Default: 0 (off)
	BatchLinger caddy.Duration `json:"batch_linger,omitempty"`

	// DisableLookupBatching sends one query per request instead of batching them
	// (see LookupLanes). Default: false
	DisableLookupBatching bool `json:"disable_lookup_batching,omitempty"`

	// DisableCountPipelining sends one Redis round trip per request instead of
	// gathering the counts of concurrent requests into one pipeline, sent as soon as
	// the previous one returns. Default: false
	DisableCountPipelining bool `json:"disable_count_pipelining,omitempty"`

	// DisableMetrics leaves the keygate_* series out of Caddy's metrics registry and
	// skips their bookkeeping on every request (docs/operations.md, Metrics). The access log
	// fields outcome, key_id and org_id stay. Default: false
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// LastUsedInterval is how often the gateway writes the last_used_at of the keys
	// it verified since the last write, with one UPDATE, off the request path: a
	// key's last_used_at lags its last use by up to this much, and is written at most
	// once per interval. At least 1s; negative (Caddyfile: off) disables it.
	// Default: 1m
	LastUsedInterval caddy.Duration `json:"last_used_interval,omitempty"`

	// UsageFlushInterval is how often the gateway writes the usage record: the
	// requests of each identified key, counted in memory per UTC minute, outcome and
	// status, and added to PostgreSQL with one INSERT, off the request path
	// (docs/operations.md, Usage). A process killed without warning loses at most this
	// much; a graceful stop or a reload writes what it holds first. At least 1s.
	// Default: 10s
	UsageFlushInterval caddy.Duration `json:"usage_flush_interval,omitempty"`

	// UsageBuffer is the most rows of the usage record held in memory, a row being a
	// key, a minute, an outcome and a status: those counted since the last write, and
	// those PostgreSQL could not take yet, which are written when it answers again.
	// Beyond it, the requests of new rows are dropped and counted in
	// keygate_usage_dropped_total. Default: 100000
	UsageBuffer int `json:"usage_buffer,omitempty"`

	// DisableUsage turns the usage record off: no request is counted or written
	// (Caddyfile: usage off). Default: false
	DisableUsage bool `json:"disable_usage,omitempty"`

	// The runtime state, built by Provision.
	databaseURL string // DatabaseURL with placeholders replaced
	redisURL    string
	secret      string
	signer      *gatewayauth.Signer // nil without identity_key
	format      keystore.Format
	fields      *fieldSet
	verifier    Verifier
	limiter     limiter.Limiter // a *redisLimiter, or the in-process limiter shared across reloads
	failClosed  bool
	failLocal   bool
	metrics     *metrics       // nil with DisableMetrics
	fallback    *limiter.Local // limiter_failure local: this instance's counts while Redis cannot count
	pgBreaker   *breaker       // around key lookups
	lastUsed    recorder       // nil with last_used_interval off
	usage       usageRecorder  // nil with usage off
	poolKeys    []string       // what to give back to pools in Cleanup
	logger      *zap.Logger    // from ctx.Logger()
	floodLog    *zap.Logger    // logger, at most one entry a second per message, for failures that come in floods
	refusedLog  *zap.Logger    // logger of an upstream refusing the gateway's credentials (upstreamRefusedLog)
}

// Verifier looks up a presented key that keystore.Format.Parse has split into its key
// id and secret: a keystore.Batcher, or a keystore.Store in a storeWithin. It keeps
// "rejected" apart from "broken": an unknown, revoked or expired key or a wrong secret
// is (Key{}, false, nil), a lookup that could not be made is an error. The first
// answers 401, the second 503. It bounds each lookup's wait by database_timeout itself.
type Verifier interface {
	VerifyParsed(ctx context.Context, keyID, secret string) (keystore.Key, bool, error)
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.v1_gateway",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision applies the defaults, replaces placeholders, and takes its PostgreSQL
// pool and Redis client (or the in-process limiter) from the pools shared across
// config reloads. It checks the options first (see Validate), so that a config that
// will be refused does not dial anything.
func (h *Handler) Provision(ctx caddy.Context) error {
	if err := h.configure(ctx.Logger()); err != nil {
		return err
	}
	warnStrippedPath(ctx, h.logger)
	if !h.DisableMetrics {
		m, key, err := loadMetrics(ctx)
		if err != nil {
			return err
		}
		h.poolKeys = append(h.poolKeys, key)
		h.metrics = m
	}

	pgSetup := connSetup{time.Duration(h.DatabaseDialTimeout), h.DatabaseMinConns}
	pool, key, err := loadPostgres(h.databaseURL, time.Duration(h.DatabaseTimeout), pgSetup, h.logger)
	if err != nil {
		return err
	}
	h.pgBreaker.probe = postgresProbe(pool, time.Duration(h.DatabaseDialTimeout+h.DatabaseTimeout))
	h.poolKeys = append(h.poolKeys, key)
	if h.LastUsedInterval > 0 {
		lu, key := h.loadLastUsed(pool)
		h.poolKeys = append(h.poolKeys, key)
		h.lastUsed = lu
	}
	if !h.DisableUsage {
		u, ukey := h.loadUsage(pool, key) // key: the pool's, which the recorder writes through
		h.poolKeys = append(h.poolKeys, ukey)
		h.usage = u
	}
	store := keystore.New(pool, h.format)
	h.verifier = storeWithin{store, time.Duration(h.DatabaseTimeout)}
	if !h.DisableLookupBatching {
		// Timeout bounds both how long a request waits for its answer and the batch
		// query, which serves many requests and so runs under none of their contexts
		// (a request giving up must not cancel the others' query).
		opts := keystore.BatcherOptions{
			Lanes:   h.LookupLanes,
			Timeout: time.Duration(h.DatabaseTimeout),
			Linger:  time.Duration(h.BatchLinger),
		}
		if h.metrics != nil {
			opts.OnBatch = h.metrics.observeBatch
		}
		h.verifier = keystore.NewBatcher(store, opts)
	}

	if h.redisURL != "" {
		setup := connSetup{time.Duration(h.RedisDialTimeout), h.RedisMinConns}
		rd, key, err := loadRedis(h.RedisMode, h.redisURL, h.RedisTLSCA, time.Duration(h.RedisTimeout), setup, h.logger)
		if err != nil {
			return err
		}
		h.poolKeys = append(h.poolKeys, key)
		opts := []limiter.Option{limiter.WithTimeout(time.Duration(h.RedisTimeout))}
		if !h.DisableCountPipelining {
			opts = append(opts, limiter.WithPipelining(time.Duration(h.RedisTimeout)), limiter.WithLinger(time.Duration(h.BatchLinger)))
		}
		lim := limiter.NewRedis(rd.client, opts...)
		budget := time.Duration(h.RedisDialTimeout + h.RedisTimeout)
		h.limiter = &redisLimiter{
			lim:     lim,
			breaker: newBreaker(redisProbe(rd.warmer, lim, budget), h.breakerChanged("redis")),
			warmer:  rd.warmer,
			metrics: h.metrics,
		}
		// The scripts and Redis's clock, read before the first count needs them; a
		// Redis that does not answer now is prepared by the breaker's probe later.
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), budget)
			defer cancel()
			_ = lim.Prepare(ctx)
		}()
		if h.failLocal {
			h.fallback = limiter.NewLocal()
		}
	} else {
		lim, key := loadLocalLimiter()
		h.poolKeys = append(h.poolKeys, key)
		h.limiter = lim
	}
	return nil
}

// configure applies the defaults, replaces placeholders, checks the options and builds
// the state that needs no dependency: everything of Provision but the pools.
func (h *Handler) configure(logger *zap.Logger) error {
	h.logger = logger
	h.floodLog = h.logger.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return zapcore.NewSamplerWithOptions(c, time.Second, 1, 0)
	}))

	if h.KeyPrefix == "" {
		h.KeyPrefix = keystore.DefaultPrefix
	}
	if h.LimiterFailure == "" {
		h.LimiterFailure = limiterFailureOpen
	}
	if h.DatabaseTimeout == 0 {
		h.DatabaseTimeout = caddy.Duration(defaultDatabaseTimeout)
	}
	if h.RedisTimeout == 0 {
		h.RedisTimeout = caddy.Duration(defaultRedisTimeout)
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

	// ReplaceKnown, not ReplaceAll: a password with braces in it is not a
	// placeholder and must survive.
	repl := caddy.NewReplacer()
	h.databaseURL = repl.ReplaceKnown(h.DatabaseURL, "")
	h.redisURL = repl.ReplaceKnown(h.RedisURL, "")
	h.secret = repl.ReplaceKnown(h.GatewaySecret, "")
	identityKey := repl.ReplaceKnown(h.IdentityKey, "")
	if h.IdentityAudience == "" {
		h.IdentityAudience = gatewayauth.DefaultAudience
	}

	if err := h.Validate(); err != nil {
		return err
	}
	h.format, _ = keystore.NewFormat(h.KeyPrefix) // valid: checked by Validate
	if h.LegacyKeys == legacyKeysReject {
		h.format = h.format.RejectingLegacy()
	}
	h.fields = newFieldSet(h.StripFields)
	h.failClosed = h.LimiterFailure == limiterFailureClosed
	h.failLocal = h.LimiterFailure == limiterFailureLocal
	h.pgBreaker = newBreaker(nil, h.breakerChanged("postgres")) // its probe comes with the pool
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

// Validate checks the options. Caddy calls it after Provision, which has applied the
// defaults and replaced the placeholders, so it sees the values that will be used.
// It is fast and dials nothing.
func (h *Handler) Validate() error {
	if h.DatabaseURL == "" {
		return errors.New("database_url is required")
	}
	if strings.TrimSpace(h.databaseURL) == "" {
		return fmt.Errorf("database_url %q is empty once its placeholders are replaced (is the environment variable set?)", h.DatabaseURL)
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
	if !validLimiterFailure(h.LimiterFailure) {
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
	return nil
}

// Cleanup gives back the pools Provision took, in the reverse order (the last-used
// flusher before the PostgreSQL pool it writes through); the last handler using one
// closes it. It tolerates a Provision that stopped half-way.
func (h *Handler) Cleanup() error {
	var errs []error
	for _, key := range slices.Backward(h.poolKeys) {
		if _, err := pools.Delete(key); err != nil {
			errs = append(errs, err)
		}
	}
	h.poolKeys = nil
	return errors.Join(errs...)
}

// ServeHTTP decides in the order of CONTRACT §2; see Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	// 1. Credentials.
	keyID, secret, ok := bearerKey(r.Header, h.format)
	if !ok {
		h.record(r, outcomeUnauthenticated, nil)
		writeUnauthenticated(w)
		return nil
	}

	// 2. The key, on this very request.
	start := h.startTimer()
	key, ok, err := h.verify(r.Context(), keyID, secret)
	h.observeLookup(r, start, err)
	if err != nil {
		h.lookupFailed(r, err)
		h.record(r, outcomeLookupUnavailable, nil)
		writeJSON(w, http.StatusServiceUnavailable, bodyServiceUnavailable)
		return nil
	}
	if !ok {
		h.record(r, outcomeUnauthenticated, nil)
		writeUnauthenticated(w)
		return nil
	}
	setIdentityPlaceholders(r, key)
	if h.lastUsed != nil {
		h.lastUsed.Record(key.ID) // in memory; written later, off the request path
	}

	// 3. API access.
	if key.RateLimit == 0 {
		h.record(r, outcomeFeatureGated, &key)
		h.countUsage(&key, keystore.OutcomeFeatureGated, http.StatusForbidden)
		writeJSON(w, http.StatusForbidden, bodyFeatureGated)
		return nil
	}

	// 4. Rate limit: every request that got here with a positive limit counts.
	var counted *limiter.Result // nil when the request was not counted
	if key.RateLimit > 0 {
		start := h.startTimer()
		rl, err := h.limiter.Allow(r.Context(), key.ID, key.RateLimit)
		h.observeCount(r, start, err)
		if err != nil && h.fallback != nil {
			h.limiterFailed(key, err)
			rl, err = h.fallback.Allow(r.Context(), key.ID, key.RateLimit)
		}
		switch {
		case err != nil && h.failClosed:
			h.limiterFailed(key, err)
			h.record(r, outcomeLimiterUnavailable, &key)
			h.countUsage(&key, keystore.OutcomeLimiterUnavailable, http.StatusServiceUnavailable)
			writeJSON(w, http.StatusServiceUnavailable, bodyServiceUnavailable)
			return nil
		case err != nil:
			h.limiterFailed(key, err) // open: through, without RateLimit headers
		default:
			// The RateLimit fields are set where the answer is written: here for a
			// 429, by writeCounted for the module's other answers, by the proxyWriter
			// for the upstream's.
			counted = &rl
			if !rl.Allowed {
				setRateLimitHeaders(w.Header(), rl)
				if c := h.logger.Check(zapcore.DebugLevel, "rate limit exceeded"); c != nil {
					c.Write(zap.String("key_id", key.ID), zap.Int("limit", rl.Limit))
				}
				h.record(r, outcomeRateLimited, &key)
				h.countUsage(&key, keystore.OutcomeRateLimited, http.StatusTooManyRequests)
				writeRateLimited(w, rl)
				return nil
			}
		}
	}

	// 5. Role. Only Admin and Editor write: a role the gateway does not know (the
	// database allows none) reads only, rather than writes.
	if !readOnlyMethod(r.Method) && key.Role != keystore.RoleAdmin && key.Role != keystore.RoleEditor {
		h.record(r, outcomeForbidden, &key)
		h.countUsage(&key, keystore.OutcomeForbidden, http.StatusForbidden)
		writeCounted(w, counted)
		writeJSON(w, http.StatusForbidden, bodyForbidden)
		return nil
	}

	// 6. GET /v1/me, answered here.
	if r.URL.Path == "/v1/me" && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		h.record(r, outcomeMe, &key)
		h.countUsage(&key, keystore.OutcomeMe, http.StatusOK)
		writeCounted(w, counted)
		writeMe(w, key)
		return nil
	}

	// 7. Proxy.
	h.record(r, outcomeProxied, &key)
	return h.proxy(w, r, next, key, counted)
}

// verify looks the key up, unless PostgreSQL's breaker is open. The verifier bounds
// the request's wait by database_timeout itself (see Provision).
func (h *Handler) verify(ctx context.Context, keyID, secret string) (keystore.Key, bool, error) {
	if !h.pgBreaker.allow() {
		return keystore.Key{}, false, errBreakerOpen
	}
	key, ok, err := h.verifier.VerifyParsed(ctx, keyID, secret)
	h.pgBreaker.done(resultOf(ctx, err))
	return key, ok, err
}

// storeWithin is the Verifier of disable_lookup_batching: a Store whose every lookup
// is bounded by database_timeout, as a Batcher's are by its Timeout.
type storeWithin struct {
	store   *keystore.Store
	timeout time.Duration
}

func (s storeWithin) VerifyParsed(ctx context.Context, keyID, secret string) (keystore.Key, bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	return s.store.VerifyParsed(ctx, keyID, secret)
}

// resultOf tells a breaker what a call under the request's context ctx came to: a
// client that went away says nothing about the dependency.
func resultOf(ctx context.Context, err error) callResult {
	switch {
	case err == nil:
		return callSucceeded
	case ctx.Err() != nil:
		return callIgnored
	}
	return callFailed
}

// breakerChanged returns the hook that logs dependency's breaker opening and closing,
// and sets its keygate_dependency_up: 0 when it opens, 1 when its probe closes it.
func (h *Handler) breakerChanged(dependency string) func(from, to breakerState) {
	return func(from, to breakerState) {
		switch {
		case to == breakerOpen && from == breakerClosed:
			h.logger.Warn("circuit breaker open: answering at once without waiting on the dependency",
				zap.String("dependency", dependency))
		case to == breakerClosed:
			h.logger.Info("circuit breaker closed: the dependency answers again",
				zap.String("dependency", dependency))
		}
		if h.metrics == nil {
			return
		}
		switch to {
		case breakerOpen:
			h.metrics.dependency(dependency).Set(0)
		case breakerClosed:
			h.metrics.dependency(dependency).Set(1)
		}
	}
}

// validLimiterFailure reports whether v is a limiter_failure mode.
func validLimiterFailure(v string) bool {
	return v == limiterFailureOpen || v == limiterFailureClosed || v == limiterFailureLocal
}

// proxy is step 7: the request goes on with the gateway's identity headers and its
// response comes back through a proxyWriter.
func (h *Handler) proxy(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler, key keystore.Key, rl *limiter.Result) error {
	hdr := r.Header
	for name := range hdr {
		if len(name) >= len("X-Gateway-") && asciiEqualFold(name[:len("X-Gateway-")], "x-gateway-") {
			delete(hdr, name)
		}
	}
	delete(hdr, "Authorization")
	delete(hdr, "Cookie")
	if _, ok := hdr["Connection"]; ok {
		keepOwnFields(hdr)
	}
	// The upstream answers uncompressed, so that its JSON can be filtered as it
	// streams (identity rather than no header: without one, Go's transport would ask
	// for gzip itself); and whole, since a byte range of a JSON document cannot be
	// filtered.
	//
	// The six values share one backing array, each slice capped at its value (see
	// writeJSON).
	v := []string{"identity", key.OrgID, key.ID, string(key.Role), h.secret, ""}
	hdr["Accept-Encoding"] = v[0:1:1]
	delete(hdr, "Range")
	delete(hdr, "If-Range")
	hdr["X-Gateway-Org-Id"] = v[1:2:2]
	hdr["X-Gateway-Key-Id"] = v[2:3:3]
	hdr["X-Gateway-Key-Role"] = v[3:4:4]
	if h.secret != "" {
		hdr["X-Gateway-Secret"] = v[4:5:5]
	}
	if h.signer != nil {
		assertion, err := h.signer.Assertion(key.ID, key.OrgID, string(key.Role))
		if err != nil {
			// Ed25519 signing does not fail with a valid key; should it, the request
			// does not go on unsigned.
			h.logger.Error("signing the identity assertion", zap.Error(err))
			h.countUsage(&key, keystore.OutcomeProxied, http.StatusInternalServerError)
			writeJSON(w, http.StatusInternalServerError, statusBody(http.StatusInternalServerError))
			return nil
		}
		v[5] = assertion
		hdr[gatewayauth.Header] = v[5:6:6]
	}

	pw := newProxyWriter(w, r, rl, h.fields, h.floodLog)
	pw.refusedLog = h.refusedLog
	defer pw.release()
	defer h.countProxied(&key, pw) // once answered, however: the status the client got
	if err := next.ServeHTTP(pw, r); err != nil {
		return pw.nextFailed(err)
	}
	if err := pw.finish(); err != nil {
		// The status and part of the body are out: all that is left is to cut the
		// response short, so that the client sees it is incomplete.
		if c := h.floodLog.Check(zapcore.ErrorLevel, "aborting a response the JSON filter could not complete"); c != nil {
			c.Write(zap.String("key_id", key.ID), zap.String("path", keystore.Redact(r.URL.Path)), zap.Error(err))
		}
		panic(http.ErrAbortHandler)
	}
	return nil
}

// keepOwnFields removes from the client's Connection header the names of the fields
// the module sets on a proxied request (X-Gateway-*, Accept-Encoding). The reverse
// proxy deletes every field Connection names, as a proxy must (RFC 9110, section
// 7.6.1), after the module has set them: a client could otherwise strip the
// gateway's identity, or have the upstream compress what the filter must read. The
// client's other names stay, and still remove the fields they name.
func keepOwnFields(hdr http.Header) {
	vals := hdr["Connection"]
	if !slices.ContainsFunc(vals, namesOwnField) {
		return
	}
	var kept []string
	for _, v := range vals {
		for name := range strings.SplitSeq(v, ",") {
			if name = strings.TrimSpace(name); name != "" && !namesOwnField(name) {
				kept = append(kept, name)
			}
		}
	}
	if len(kept) == 0 {
		delete(hdr, "Connection")
		return
	}
	hdr["Connection"] = []string{strings.Join(kept, ", ")}
}

// namesOwnField reports whether a Connection value names a field the module sets,
// in any case, among other names or alone.
func namesOwnField(v string) bool {
	for name := range strings.SplitSeq(v, ",") {
		name = strings.TrimSpace(name)
		if asciiEqualFold(name, "accept-encoding") ||
			len(name) >= len("x-gateway-") && asciiEqualFold(name[:len("x-gateway-")], "x-gateway-") {
			return true
		}
	}
	return false
}

// setIdentityPlaceholders makes the key's identity available to the rest of the
// config and to Caddy's access log (user_id), never the key itself.
func setIdentityPlaceholders(r *http.Request, key keystore.Key) {
	repl, ok := r.Context().Value(caddy.ReplacerCtxKey).(*caddy.Replacer)
	if !ok {
		return
	}
	repl.Set("http.auth.user.id", key.ID)
	repl.Set("http.auth.user.org_id", key.OrgID)
	repl.Set("http.auth.user.role", string(key.Role))
}

// lookupFailed logs a key lookup that PostgreSQL could not answer, at most once a
// second: a dead database fails every request.
func (h *Handler) lookupFailed(r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away; not PostgreSQL's fault
	}
	if c := h.floodLog.Check(zapcore.ErrorLevel, "key lookup failed; answering 503"); c != nil {
		c.Write(zap.Error(err))
	}
}

// limiterFailed logs a count that Redis could not make, at most once a second.
func (h *Handler) limiterFailed(key keystore.Key, err error) {
	msg := "rate limiter failed; letting the request through (limiter_failure open)"
	switch {
	case h.failClosed:
		msg = "rate limiter failed; answering 503 (limiter_failure closed)"
	case h.failLocal:
		msg = "rate limiter failed; counting in this instance (limiter_failure local)"
	}
	if c := h.floodLog.Check(zapcore.WarnLevel, msg); c != nil {
		c.Write(zap.String("key_id", key.ID), zap.Error(err))
	}
}

// readOnlyMethod reports whether a Viewer key may use method.
func readOnlyMethod(method string) bool {
	return method == http.MethodGet || method == http.MethodHead || method == http.MethodOptions
}

// Interface guards
var (
	_ caddy.Module                = (*Handler)(nil)
	_ caddy.Provisioner           = (*Handler)(nil)
	_ caddy.Validator             = (*Handler)(nil)
	_ caddy.CleanerUpper          = (*Handler)(nil)
	_ caddyhttp.MiddlewareHandler = (*Handler)(nil)
	_ caddyfile.Unmarshaler       = (*Handler)(nil)
	_ Verifier                    = (*keystore.Store)(nil)
	_ Verifier                    = (*keystore.Batcher)(nil)
)
