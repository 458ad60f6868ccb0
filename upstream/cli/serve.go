package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/store"
)

// shutdownTimeout is how long serve waits for requests in flight after SIGINT or SIGTERM.
const shutdownTimeout = 15 * time.Second

func (c *cli) serve(name string, args []string) error {
	fs := c.flags(name, "[--addr HOST:PORT] [--session-ttl DURATION] [--key-prefix P] [--secure-cookies] [--trusted-proxies CIDRS] [--database-timeout DURATION] [--purge-interval DURATION] [--leak-report-token TOKEN] [--gateway-jwks URL|FILE] [--gateway-audience AUD] [--admin-addr HOST:PORT] [--login-window DURATION] [--login-failures-per-email N] [--login-failures-per-client N] [--migrate]",
		`Serves the upstream's HTTP interface: sessions, dashboard API keys and monitors.
Requires DATABASE_URL, and GATEWAY_SECRET (the secret the gateway sends in
X-Gateway-Secret) or --gateway-jwks (the gateway's signed identity); with both, /v1
requests must carry both.
Logs JSON to standard error. Stops gracefully on SIGINT or SIGTERM.`)
	addr := fs.String("addr", "127.0.0.1:9000", "`address` to listen on")
	ttl := fs.Duration("session-ttl", httpapi.DefaultSessionTTL, "lifetime of a login `session`")
	prefixDefault := c.getenv("KEY_PREFIX")
	if prefixDefault == "" {
		prefixDefault = keystore.DefaultPrefix
	}
	prefix := fs.String("key-prefix", prefixDefault, "`prefix` of the API keys created, as configured in the gateway (env KEY_PREFIX)")
	secureCookies := fs.Bool("secure-cookies", false, "mark the session cookie Secure even on plain-HTTP requests, for use behind a proxy that terminates TLS")
	trusted := fs.String("trusted-proxies", defaultTrustedProxies, "comma-separated `CIDRs` of the proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (empty: none)")
	dbTimeout := fs.Duration("database-timeout", store.DefaultDatabaseTimeout, "bound on each database wait (pool acquire, statement); past it a request answers 503")
	purgeEvery := fs.Duration("purge-interval", httpapi.DefaultPurgeInterval, "how often expired sessions and old login attempts are deleted")
	loginWindow := fs.Duration("login-window", store.DefaultLoginThrottle.Window, "sliding `window` in which failed logins are counted")
	perEmail := fs.Int("login-failures-per-email", store.DefaultLoginThrottle.PerEmail, "failed logins allowed per (email, client address) in a window before 429")
	perClient := fs.Int("login-failures-per-client", store.DefaultLoginThrottle.PerClient, "failed logins allowed per client address in a window, whatever the emails, before 429")
	migrate := fs.Bool("migrate", false, "apply the database schema before serving (as `upstream migrate` does)")
	leakToken := fs.String("leak-report-token", c.getenv("LEAK_REPORT_TOKEN"), "bearer `token` of POST /security/leaked-keys, at least 32 characters (env LEAK_REPORT_TOKEN; default: the route is absent)")
	jwks := fs.String("gateway-jwks", c.getenv("GATEWAY_JWKS"), "the gateway's public keys, to verify the signed identity of /v1 requests (X-Gateway-Identity): a JWKS `URL` (http:// or https://, the gateway's /.well-known/jwks.json) or a PEM file (env GATEWAY_JWKS; default: none, GATEWAY_SECRET alone)")
	audience := fs.String("gateway-audience", gatewayauth.DefaultAudience, "the `aud` the gateway's identity assertions must carry (its identity_audience)")
	adminAddr := fs.String("admin-addr", "", "`address` of /metrics, /healthz and /readyz, apart from --addr (default: not served)")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if *ttl <= 0 {
		return usageErrorf("--session-ttl must be positive")
	}
	if *dbTimeout <= 0 {
		return usageErrorf("--database-timeout must be positive")
	}
	if *purgeEvery <= 0 {
		return usageErrorf("--purge-interval must be positive")
	}
	if *loginWindow <= 0 {
		return usageErrorf("--login-window must be positive")
	}
	if *perEmail <= 0 || *perClient <= 0 {
		return usageErrorf("--login-failures-per-email and --login-failures-per-client must be positive")
	}
	if *leakToken != "" && len(*leakToken) < httpapi.MinLeakReportToken {
		return usageErrorf("--leak-report-token must be at least %d characters", httpapi.MinLeakReportToken)
	}
	proxies, err := parseTrustedProxies(*trusted)
	if err != nil {
		return usageErrorf("--trusted-proxies: %v", err)
	}
	format, err := keystore.NewFormat(*prefix)
	if err != nil {
		return usageErrorf("--key-prefix: %v", err)
	}
	dbURL, err := c.databaseURL()
	if err != nil {
		return err
	}
	secret := c.getenv("GATEWAY_SECRET")
	if secret == "" && *jwks == "" {
		return usageErrorf("neither GATEWAY_SECRET nor --gateway-jwks is set: set GATEWAY_SECRET to the gateway_secret of the gateway's configuration, or --gateway-jwks to its JWKS")
	}
	var identity *gatewayauth.Verifier
	if *jwks != "" {
		cfg := gatewayauth.Config{KeyFile: *jwks, Audience: *audience}
		if strings.HasPrefix(*jwks, "http://") || strings.HasPrefix(*jwks, "https://") {
			cfg = gatewayauth.Config{JWKSURL: *jwks, Audience: *audience}
		}
		if identity, err = gatewayauth.New(cfg); err != nil {
			return usageErrorf("--gateway-jwks: %v", err)
		}
		defer identity.Close()
	}

	logger := newLogger(c.stderr)
	defer func() { _ = logger.Sync() }()
	if secret != "" && len(secret) < 16 {
		logger.Warn("gateway secret is shorter than 16 characters")
	}
	if identity != nil {
		// The gateway may start after the upstream: a JWKS not there yet is fetched
		// again in the background, and when the first assertion comes.
		if err := identity.Refresh(c.ctx); err != nil {
			logger.Warn("the gateway's JWKS could not be fetched yet; /v1 answers 503 until it can", zap.Error(err))
		}
	}
	if *migrate {
		if err := schema.Migrate(c.ctx, dbURL); err != nil {
			return err
		}
	}
	pool, err := c.connect(0, *dbTimeout)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(c.ctx, pool); err != nil {
		return err
	}
	var metrics *httpapi.Metrics
	if *adminAddr != "" {
		metrics = httpapi.NewMetrics(pool)
	}
	srv, err := httpapi.NewServer(httpapi.Config{Pool: pool, Logger: logger, GatewaySecret: secret, Identity: identity, KeyFormat: format,
		SessionTTL: *ttl, SecureCookies: *secureCookies, TrustedProxies: proxies, Metrics: metrics,
		LeakReportToken: *leakToken,
		LoginThrottle:   store.LoginThrottle{Window: *loginWindow, PerEmail: *perEmail, PerClient: *perClient}})
	if err != nil {
		return err
	}
	if *adminAddr != "" {
		stopAdmin, err := serveAdmin(*adminAddr, pool, metrics, logger)
		if err != nil {
			return err
		}
		defer stopAdmin()
	}
	purgeCtx, stopPurge := context.WithCancel(c.ctx)
	purged := make(chan struct{})
	go func() {
		defer close(purged)
		srv.RunPurge(purgeCtx, *purgeEvery)
	}()
	// The purge stops before the pool closes (defers run last first).
	defer func() {
		stopPurge()
		<-purged
	}()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	hs := &http.Server{
		Handler:           srv,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          zap.NewStdLog(logger.Named("http")),
	}
	logger.Info("serving", zap.String("addr", ln.Addr().String()),
		zap.String("key_prefix", format.Prefix()), zap.Duration("session_ttl", *ttl),
		zap.Duration("database_timeout", *dbTimeout), zap.Int32("pool_max_conns", pool.Config().MaxConns),
		zap.Duration("login_window", *loginWindow), zap.Int("login_failures_per_email", *perEmail),
		zap.Int("login_failures_per_client", *perClient))
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-c.ctx.Done():
	}
	logger.Info("shutting down")
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(ctx); err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// checkSchema fails when the database lacks the schema this code needs, with the
// command that fixes it.
func checkSchema(ctx context.Context, pool *pgxpool.Pool) error {
	v, err := store.New(pool).SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if v < store.RequiredSchemaVersion {
		return fmt.Errorf("the database schema is at version %d and this program needs %d: run `upstream migrate` first (or serve --migrate)",
			v, store.RequiredSchemaVersion)
	}
	return nil
}

// newLogger returns a zap logger writing JSON lines to w at info level and above.
func newLogger(w io.Writer) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	out := zapcore.Lock(zapcore.AddSync(w))
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), out, zap.InfoLevel), zap.ErrorOutput(out))
}

// defaultTrustedProxies is serve's --trusted-proxies when not given: the loopback
// networks, where a Caddy on the same machine connects from.
const defaultTrustedProxies = "127.0.0.0/8,::1/128"

// parseTrustedProxies parses a comma-separated list of CIDR prefixes or bare addresses
// (a bare address is its own /32 or /128). An empty list trusts no proxy.
func parseTrustedProxies(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, item := range splitList(s) {
		if p, err := netip.ParsePrefix(item); err == nil {
			out = append(out, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(item)
		if err != nil {
			return nil, fmt.Errorf("%q is neither a CIDR prefix nor an IP address", item)
		}
		a = a.Unmap()
		out = append(out, netip.PrefixFrom(a, a.BitLen()))
	}
	return out, nil
}

// serveAdmin serves httpapi.AdminHandler on addr until the returned stop is called, which
// waits up to shutdownTimeout for the requests in flight.
func serveAdmin(addr string, pool *pgxpool.Pool, m *httpapi.Metrics, logger *zap.Logger) (stop func(), err error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on --admin-addr: %w", err)
	}
	hs := &http.Server{
		Handler:           httpapi.AdminHandler(pool, m),
		ReadHeaderTimeout: 10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       120 * time.Second,
		ErrorLog:          zap.NewStdLog(logger.Named("admin")),
	}
	logger.Info("serving admin endpoints", zap.String("admin_addr", ln.Addr().String()))
	go func() {
		if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
			logger.Error("admin endpoints stopped", zap.Error(err))
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
		defer cancel()
		_ = hs.Shutdown(ctx)
	}, nil
}
