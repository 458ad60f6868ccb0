// Package caddymodule is the Caddy module v1_gateway (http.handlers.v1_gateway). It
// enforces the public /v1 API contract at the edge. For every request it checks the
// API key against PostgreSQL and the networks it may be used from, the organisation's
// API access, the key's and the organisation's budgets, the key's role and scopes. It
// answers GET /v1/me itself. It hands everything else to the next
// handler, the reverse proxy to the upstream, with the caller's identity asserted in
// X-Gateway-* headers. It filters the fields named in strip_fields out of every JSON
// response. README.md gives the decision order; docs/configuration.md the options.
package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"slices"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/keygate/keygate/caddymodule/conns"
	// v1_gateway_jwks, keygate_health and keygate_redact come with v1_gateway: a
	// Caddy built with this package has them.
	_ "github.com/keygate/keygate/caddymodule/health"
	_ "github.com/keygate/keygate/caddymodule/jwks"
	"github.com/keygate/keygate/caddymodule/placement"
	_ "github.com/keygate/keygate/caddymodule/redact"
	"github.com/keygate/keygate/caddymodule/routetable"
	"github.com/keygate/keygate/fieldstrip"
	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

func init() {
	caddy.RegisterModule(Handler{})
}

// Handler is the v1_gateway handler: the whole /v1 contract at the edge. It decides
// in the order README.md gives: credentials, the key and its networks, API access, the
// budgets (each request weighing its route's cost), the role and a scoped key's
// scopes, GET /v1/me, the proxy. The first step that applies answers. ServeHTTP numbers
// the steps.
//
// The module needs full paths. Use it under `handle /v1/*`, not `handle_path /v1/*`,
// which strips the prefix: /v1/me would not be recognised, and the upstream would get
// paths without /v1.
//
// A PostgreSQL that fails, or is slower than database_timeout, answers 503
// service_unavailable. It never answers 401 and never lets a request through.
// limiter_failure decides for a Redis that fails. After a few failures in a row, a
// circuit breaker per dependency stops waiting on it (see breaker). The same answers
// then come at once, and one probe at a time asks whether the dependency is back. An
// upstream that is down answers 502 bad_gateway; one that times out, 504
// gateway_timeout. Every error the module answers is application/json with a string
// field "error".
//
// The module sets the placeholders {http.auth.user.id}, {http.auth.user.org_id} and
// {http.auth.user.role}. Caddy's access log shows the first, the key id, as user_id.
// Under Caddy's tracing directive, the request's span shows what the module decided
// and its waits (package spans, docs/operations.md, Tracing).
type Handler struct {
	// DatabaseURL is the postgres:// URL of the database holding the API keys and
	// plans. Every request queries it. Placeholders such as {env.DATABASE_URL} are
	// replaced when the config is loaded. pgxpool's URL parameters tune the pool, for
	// example pool_max_conns=32. pgxpool's default size is 4 or the number of CPUs,
	// whichever is greater. Every handler with the same URL shares one pool, which
	// survives config reloads. Required.
	DatabaseURL string `json:"database_url,omitempty"`

	// DatabaseReadURLs are the URLs of hot standbys of database_url's PostgreSQL,
	// streaming from it. Key lookups spread over those that are up and within
	// database_read_max_lag. Each is fenced on the primary's WAL position, so a key
	// revoked before a request arrives is refused on that request whatever a
	// standby's lag (docs/operations.md, Standbys). With none up, the primary answers.
	// Each has a pool of its own, sized and prepared like database_url's, that
	// survives config reloads. Placeholders are replaced at load.
	// Default: none (every lookup on database_url)
	DatabaseReadURLs []string `json:"database_read_urls,omitempty"`

	// DatabaseReadMaxLag leaves out of the lookups a standby of database_read_urls
	// that has not replayed what the primary had written this long ago, until it
	// catches up. A standby within it still answers only lookups it has caught up
	// with. Default: 1s
	DatabaseReadMaxLag caddy.Duration `json:"database_read_max_lag,omitempty"`

	// RedisURL is the redis:// or rediss:// URL of the Redis that counts requests per
	// key. Every gateway instance using it shares its counts, so a key has one budget
	// however many instances serve it. Placeholders are replaced at load. Without it,
	// counts are kept in this process only, which suits a single instance.
	// Default: none (in-process counts)
	RedisURL string `json:"redis_url,omitempty"`

	// RedisMode is how redis_url is read. "single" is one server (go-redis ParseURL).
	// "cluster" lists Redis Cluster seed nodes (ParseClusterURL). "sentinel" lists
	// Sentinel addresses, with ?master_name= (ParseFailoverURL). Default: single
	RedisMode string `json:"redis_mode,omitempty"`

	// RedisTLSCA is a PEM file of the CAs a rediss:// server certificate must chain to,
	// in every redis_mode. Default: the system roots
	RedisTLSCA string `json:"redis_tls_ca,omitempty"`

	// KeyPrefix is the prefix of the API keys: the <key_prefix> of
	// <key_prefix>_live_<keyId>.<secret>. It must match [a-z][a-z0-9]{0,15}.
	// Default: mon
	KeyPrefix string `json:"key_prefix,omitempty"`

	// LegacyKeys is what happens to a key made before secrets carried a checksum
	// (docs/security.md, Keys). "accept" looks it up as any other key, so every made-up
	// key of that shape costs a query. "reject" answers it the one 401 without a query.
	// A key with a checksum is checked before any query either way: a wrong checksum is
	// the 401 at once.
	// Default: accept
	LegacyKeys string `json:"legacy_keys,omitempty"`

	// GatewaySecret is sent to the upstream in X-Gateway-Secret on every proxied
	// request. An upstream with GATEWAY_SECRET refuses /v1 requests without it.
	// Placeholders such as {env.GATEWAY_SECRET} are replaced at load. It is required
	// unless identity_key is set. With identity_key, an empty one (an unset variable) is
	// not sent.
	GatewaySecret string `json:"gateway_secret,omitempty"`

	// IdentityKey is a PEM file of an Ed25519 private key, in PKCS#8 as `openssl genpkey
	// -algorithm ed25519` writes it. With it, every proxied request carries
	// X-Gateway-Identity: an EdDSA-signed JWT of the key id (sub), org_id and role, for
	// identity_audience, valid for a minute. Upstreams verify it with the public key
	// (package gatewayauth; v1_gateway_jwks publishes it). An assertion is signed once
	// per key, org and role, and reused for half its lifetime. Placeholders are replaced
	// at load. Default: none (no assertion)
	IdentityKey string `json:"identity_key,omitempty"`

	// IdentityAudience is the aud of the identity assertions: the upstreams they are
	// meant for. Default: keygate-upstream
	IdentityAudience string `json:"identity_audience,omitempty"`

	// StripFields are the member names removed from every JSON response of the
	// upstream, at any depth: in objects, in arrays, in objects in arrays. A body that
	// is JSON is filtered whatever its Content-Type says. Names match once their JSON
	// escapes are decoded, and in any case, as Go's encoding/json matches members to
	// fields ("Config" is config). Setting it replaces the default list: name the
	// defaults again to keep them.
	// Default: config assertions config_version paused_reason org_id deleted_at
	StripFields []string `json:"strip_fields,omitempty"`

	// LimiterFailure is what a request of a rate-limited key gets while Redis cannot
	// count it: unreachable, hung, or slower than redis_timeout. "open" lets it through
	// without RateLimit headers. "closed" answers 503 service_unavailable. "local" counts
	// it in this process against the same limit, with RateLimit headers and 429s as
	// usual. A local count is a budget per gateway instance: with n instances, a key may
	// get up to n times its limit while Redis is down. Local counts start from zero, as
	// they know nothing of what Redis counted.
	// Default: open
	LimiterFailure string `json:"limiter_failure,omitempty"`

	// DatabaseTimeout bounds the key lookup of a request, including the wait for a
	// connection. A lookup that takes longer answers 503 service_unavailable.
	// Default: 2s
	DatabaseTimeout caddy.Duration `json:"database_timeout,omitempty"`

	// RedisTimeout bounds the rate-limit count of a request in Redis: dial, pool wait,
	// write and read, with no retry. A count that takes longer is a limiter failure,
	// which limiter_failure decides. Default: 200ms
	RedisTimeout caddy.Duration `json:"redis_timeout,omitempty"`

	// DatabaseDialTimeout bounds opening a PostgreSQL connection: TCP, TLS, startup and
	// authentication. It bounds preparing the connection's lookups separately. Opening
	// runs on this budget, not on a request's (see warm.go). So a database slow to
	// connect to is slow once, not on every request. The URL's connect_timeout, when
	// set, wins. Default: 5s
	DatabaseDialTimeout caddy.Duration `json:"database_dial_timeout,omitempty"`

	// DatabaseMinConns is the floor of PostgreSQL connections the pool keeps open and
	// prepared, so that requests find them ready. A batch that finds none idle waits
	// several round trips for a new one. The pool grows to the floor unless the URL sets
	// a smaller pool_max_conns. The URL's pool_min_conns, when larger, wins.
	// Default: lookup_lanes + 10 (the lanes' queries, up to nine batches that went out
	// on their own while PostgreSQL is slow, and the last_used_at and usage writes),
	// or 4 with disable_lookup_batching
	DatabaseMinConns int `json:"database_min_conns,omitempty"`

	// RedisDialTimeout bounds opening a Redis connection: TCP, TLS, HELLO/AUTH and
	// CLIENT SETINFO. The warmer of redis_min_conns opens them. It also bounds the
	// limiter's preparation, at start and in the breaker's probe: loading its scripts
	// and reading Redis's clock. None of that runs on a request's deadline. Default: 5s
	RedisDialTimeout caddy.Duration `json:"redis_dial_timeout,omitempty"`

	// RedisMinConns is the floor of Redis connections kept open and greeted, in each
	// primary's pool on a Cluster. A goroutine of its own tops it up a few times a
	// second (see warm.go). It covers the pipelined rounds that overlap while Redis is
	// slow. Default: 10
	RedisMinConns int `json:"redis_min_conns,omitempty"`

	// LookupLanes is how many batched key lookups may be in flight at once. Concurrent
	// requests share one query (keystore.Batcher), sent as soon as a lane is free. A
	// request only joins a query not yet sent (internal/gather, Freshness). One lane
	// makes the largest batches, which suited a 2-core machine best
	// (docs/performance.md). Default: 1
	LookupLanes int `json:"lookup_lanes,omitempty"`

	// BatchLinger lets a batch of key lookups, or a round of counts, wait for more
	// requests while they come fast. The batch goes out once requests pause, or
	// BatchLinger after its first request, or as soon as it is full. internal/gather
	// holds the policy (Options.Linger). Fewer, larger round trips cost the gateway,
	// PostgreSQL and Redis less CPU per request. A request may wait up to twice
	// BatchLinger longer: once for its lookup, once for its count. Freshness holds
	// (internal/gather, Freshness). It is at most a tenth of database_timeout and of
	// redis_timeout (docs/performance.md).
	// Default: 0 (off)
	BatchLinger caddy.Duration `json:"batch_linger,omitempty"`

	// DisableLookupBatching sends one query per request instead of batching them (see
	// LookupLanes). Default: false
	DisableLookupBatching bool `json:"disable_lookup_batching,omitempty"`

	// DisableCountPipelining sends one Redis round trip per request. Otherwise the
	// counts of concurrent requests go in one pipeline, sent as soon as the previous one
	// returns. Default: false
	DisableCountPipelining bool `json:"disable_count_pipelining,omitempty"`

	// DisableMetrics leaves the keygate_* series out of Caddy's metrics registry, and
	// skips their bookkeeping on every request (docs/operations.md, Metrics). The access
	// log fields outcome, key_id and org_id stay. Default: false
	DisableMetrics bool `json:"disable_metrics,omitempty"`

	// LastUsedInterval is how often the gateway writes the last_used_at of the keys it
	// verified since the last write. One UPDATE does it, off the request path. A key's
	// last_used_at lags its last use by up to this much. It is at least 1s; negative
	// (Caddyfile: off) disables it.
	// Default: 1m
	LastUsedInterval caddy.Duration `json:"last_used_interval,omitempty"`

	// UsageFlushInterval is how often the gateway writes the usage record. It counts
	// the requests of each identified key in memory, per UTC minute, outcome and
	// status, and adds them to PostgreSQL with one INSERT, off the request path
	// (docs/operations.md, Usage). A process killed without warning loses at most this
	// much. A graceful stop or a reload writes what it holds first. At least 1s.
	// Default: 10s
	UsageFlushInterval caddy.Duration `json:"usage_flush_interval,omitempty"`

	// UsageBuffer is the most rows of the usage record held in memory. A row is a key,
	// a minute, an outcome and a status. They are the rows counted since the last
	// write, and those PostgreSQL could not take yet. Beyond it, the requests of new
	// rows are dropped and counted in keygate_usage_dropped_total. Default: 100000
	UsageBuffer int `json:"usage_buffer,omitempty"`

	// DisableUsage turns the usage record off: no request is counted or written
	// (Caddyfile: usage off). Default: false
	DisableUsage bool `json:"disable_usage,omitempty"`

	// Routes is the route table: ordered rules, each a method set and a path pattern
	// with the scope a scoped key needs and the cost of a request, in units of every
	// budget. The first rule a request matches applies. A scoped key on a route no
	// rule matches is refused; an unscoped key there counts 1. GET /v1/me needs no
	// scope whatever the table. Naming any rule replaces the whole built-in table
	// (docs/configuration.md, Scopes and route costs).
	// Default: the built-in table of /v1 (monitors:read, monitors:write, monitors:delete)
	Routes []Route `json:"routes,omitempty"`

	// MaxRequestBody is the largest request body, in bytes, the gateway passes on. The
	// gateway reads a body whole, up to it, before the request goes upstream. A
	// larger one answers 413 request_too_large: at once when Content-Length says so,
	// and when a chunked body crosses it. The upstream's own limit is the default, so
	// the upstream never sees more than it would accept, and the 413 is the gateway's
	// every time (docs/configuration.md, Request bodies). The Caddyfile takes sizes
	// such as 1MiB.
	// Default: 1MiB
	MaxRequestBody int64 `json:"max_request_body,omitempty"`

	// The runtime state, built by Provision.
	databaseURL string   // DatabaseURL with placeholders replaced
	readURLs    []string // DatabaseReadURLs with placeholders replaced
	redisURL    string
	secret      string
	signer      *gatewayauth.Signer // nil without identity_key
	format      keystore.Format
	fields      *fieldstrip.Fields
	routes      *routetable.Table // Routes, or routetable.Builtin
	lookups     lookups           // PostgreSQL, behind its breaker (dependencies.go)
	counts      counts            // Redis, behind its breaker, or the in-process limiter
	failMode    limiterFailure    // LimiterFailure
	fallback    *limiter.Local    // failLocal: this instance's counts while Redis cannot count
	metrics     *metrics          // nil with DisableMetrics
	lastUsed    recorder          // nil with last_used_interval off
	usage       usageRecorder     // nil with usage off
	poolKeys    []string          // what to give back to pools in Cleanup
	inflight    *conns.Inflight   // the requests being answered, which keep the pools
	logger      *zap.Logger       // from ctx.Logger()
	floodLog    *zap.Logger       // logger, at most one entry a second per message, for failures that come in floods
	refusedLog  *zap.Logger       // logger of an upstream refusing the gateway's credentials (upstreamRefusedLog)
	secondLooks secondLooks       // the workers of refuseAfter's second looks
}

// Route is one rule of the route table (Routes): the requests it matches, the scope
// a scoped key needs for them and what each costs. Package routetable matches them.
type Route = routetable.Rule

// Verifier looks up a presented key, split by keystore.Format.Parse into its key id
// and secret, asked from the client address from (clientAddr). It is a
// keystore.Batcher, or a keystore.Store in a storeWithin. It keeps "rejected" apart
// from "broken". An unknown, revoked or expired key, a wrong secret, or a key whose
// allowed networks do not hold from, is (Key{}, false, nil): the 401. A key found may
// still not allow from (a batch partner's address found it): ServeHTTP checks again.
// A lookup that could not be made is an error: the 503. It bounds each lookup's wait
// by database_timeout itself.
type Verifier interface {
	VerifyParsed(ctx context.Context, keyID, secret string, from netip.Addr) (keystore.Key, bool, error)
}

// CaddyModule returns the Caddy module information.
func (Handler) CaddyModule() caddy.ModuleInfo {
	return caddy.ModuleInfo{
		ID:  "http.handlers.v1_gateway",
		New: func() caddy.Module { return new(Handler) },
	}
}

// Provision applies the defaults and replaces the placeholders. It checks the
// options first (Validate), so a config that will be refused dials nothing. Then it
// takes the PostgreSQL pool and the Redis client, or the in-process limiter, from
// the pools shared across config reloads (pools.go).
func (h *Handler) Provision(ctx caddy.Context) error {
	h.inflight = new(conns.Inflight)
	if err := h.configure(ctx.Logger()); err != nil {
		return err
	}
	placement.WarnStrippedPath(ctx, h.logger)
	var looksKey string
	h.secondLooks, looksKey = loadSecondLooks()
	h.poolKeys = append(h.poolKeys, looksKey)
	if !h.DisableMetrics {
		m, key, err := loadMetrics(ctx)
		if err != nil {
			return err
		}
		h.poolKeys = append(h.poolKeys, key)
		h.metrics = m
	}

	pool, poolKey, err := h.provisionLookups() // the primary's pool, which the usage record writes through
	if err != nil {
		return err
	}
	if h.LastUsedInterval > 0 {
		lu, key := h.loadLastUsed(pool)
		h.poolKeys = append(h.poolKeys, key)
		h.lastUsed = lu
	}
	// An organisation's month that Redis lost starts again from the usage record,
	// and, with the record on, from what this instance has counted and not written.
	used := keystore.New(pool, h.format).MonthUsed
	if !h.DisableUsage {
		u, key := h.loadUsage(pool, poolKey)
		h.poolKeys = append(h.poolKeys, key)
		h.usage = u
		used = u.MonthUsed
	}
	return h.provisionCounts(h.monthSeed(used))
}

// Cleanup gives back the pools Provision took, in reverse order: the last-used
// flusher before the PostgreSQL pool it writes through. The last handler using a
// pool closes it. Requests still being answered keep them: the last to finish gives
// them back (conns.Inflight). Cleanup tolerates a Provision that stopped half-way.
func (h *Handler) Cleanup() error {
	keys, now := h.poolKeys, make(chan error, 1)
	h.poolKeys = nil
	h.inflight.Close(func(later bool) {
		var errs []error
		for _, key := range slices.Backward(keys) {
			if _, err := pools.Delete(key); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); !later {
			now <- err
		} else if err != nil {
			h.logger.Error("giving back the pools of an unloaded config", zap.Error(err))
		}
	})
	select {
	case err := <-now:
		return err
	default:
		return nil // the last request still being answered gives them back
	}
}

// ServeHTTP decides in the order README.md gives; see Handler.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request, next caddyhttp.Handler) error {
	h.inflight.Enter()
	defer h.inflight.Leave()
	// 0. The path: one the route table and the upstream read alike, so that the path
	// decided is the path sent.
	if problem := routetable.CheckTarget(r.URL); problem != "" {
		h.answer(w, r, keystore.OutcomeInvalidPath, nil, invalidPathBody(problem))
		return nil
	}

	// 1. Credentials.
	keyID, secret, ok := bearerKey(r.Header, h.format)
	if !ok {
		h.record(r, keystore.OutcomeUnauthenticated, nil)
		writeUnauthenticated(w, keystore.OutcomeUnauthenticated.Status())
		return nil
	}

	// 2. The key, on this very request, from this address.
	from := clientAddr(r)
	key, ok, err := h.lookups.verify(r.Context(), keyID, secret, from)
	if err != nil {
		h.lookupFailed(r, err)
		h.answer(w, r, keystore.OutcomeLookupUnavailable, nil, bodyServiceUnavailable)
		return nil
	}
	if !ok {
		h.refuseLookedUp(w, r, keyID, secret, from)
		return nil
	}
	if len(key.AllowedCIDRs) > 0 && !key.AllowsAddr(from) {
		// The very answer of an unknown key: a stolen key tells its thief nothing.
		h.refuse(w, r, key, from)
		return nil
	}
	setIdentityPlaceholders(r, key)
	if h.lastUsed != nil {
		h.lastUsed.Record(key.ID) // in memory; written later, off the request path
	}

	// 3. API access.
	if key.RateLimit == 0 {
		h.answer(w, r, keystore.OutcomeFeatureGated, &key, bodyFeatureGated)
		return nil
	}

	// 4. The budgets: the key's minute, the organisation's minute and month, each
	// counting the cost of the request's route.
	var rt *routetable.Route
	if key.Scopes != nil || h.routes.Weighed {
		rt = h.routes.Match(r)
	}
	cost := rt.Cost()
	count, answered := h.rateLimit(w, r, &key, cost)
	if answered {
		return nil
	}

	// 5. The role. Only Admin and Editor write. A role the gateway does not know reads
	// only; the database allows none.
	if !readOnlyMethod(r.Method) && key.Role != keystore.RoleAdmin && key.Role != keystore.RoleEditor {
		setRateLimit(w.Header(), count)
		h.answerUnits(w, r, keystore.OutcomeForbidden, &key, cost, bodyForbidden)
		return nil
	}

	// 5b. The scopes of a scoped key: its route's, deny by default. GET /v1/me needs
	// none.
	me := r.URL.Path == "/v1/me" && (r.Method == http.MethodGet || r.Method == http.MethodHead)
	if ok, missing := rt.Allows(key.Scopes); !ok && !me {
		setRateLimit(w.Header(), count)
		h.answerUnits(w, r, keystore.OutcomeForbidden, &key, cost, scopeForbiddenBody(missing))
		return nil
	}

	// 6. GET /v1/me, answered here.
	if me {
		setRateLimit(w.Header(), count)
		h.answerUnits(w, r, keystore.OutcomeMe, &key, cost, meBody(key, count))
		return nil
	}

	// 7. Proxy.
	h.recordUnits(r, keystore.OutcomeProxied, &key, cost)
	return h.proxy(w, r, next, key, count, cost)
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
	_ Denier                      = (*keystore.Denials)(nil)
)
