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
	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/tracing"
	"github.com/keygate/keygate/upstream/usageexport"
	"github.com/keygate/keygate/upstream/webhook"
)

// serveConfig is what serve runs with, parsed from its flags and environment.
type serveConfig struct {
	// api is the server's configuration. runServe adds its Pool, Logger and Metrics.
	api        httpapi.Config
	addr       string
	adminAddr  string // "": the admin endpoints are not served
	dbURL      string
	dbTimeout  time.Duration
	purgeEvery time.Duration
	// rollupEvery is the usage record's roll-up interval.
	rollupEvery time.Duration
	// webhookPoll is how often the webhook dispatcher looks for due deliveries.
	webhookPoll time.Duration
	// export is the usage export's configuration; its URL is "" when there is none.
	export  usageexport.Config
	migrate bool
}

// serve is `upstream serve`: parseServe, then runServe.
func (c *cli) serve(name string, args []string) error {
	cfg, err := c.parseServe(name, args)
	if err != nil {
		return err
	}
	return c.runServe(cfg)
}

// parseServe parses serve's flags and environment into a serveConfig. It makes every
// check that needs no database. So a bad command line fails at once, with exit code 2.
func (c *cli) parseServe(name string, args []string) (serveConfig, error) {
	fs := c.flags(name, "[--addr HOST:PORT] [--session-ttl DURATION] [--key-prefix P] [--secure-cookies] [--trusted-proxies CIDRS] [--database-timeout DURATION] [--purge-interval DURATION] [--usage-rollup-interval DURATION] [--leak-report-token TOKEN] [--gateway-jwks URL|FILE] [--gateway-audience AUD] [--admin-addr HOST:PORT] [--login-window DURATION] [--login-failures-per-email N] [--login-failures-per-client N] [--webhook-allow-http] [--webhook-allow-private] [--webhook-poll-interval DURATION] [--usage-export-url URL] [--usage-export-secret SECRET] [--usage-export-token TOKEN] [--usage-export-delay DURATION] [--usage-export-interval DURATION] [--usage-export-batch-size N] [--usage-export-timeout DURATION] [--usage-export-backoff DURATION] [--usage-export-backoff-max DURATION] [--migrate]",
		`Serves the upstream's HTTP interface: sessions, dashboard API keys and monitors.
Requires DATABASE_URL, and GATEWAY_SECRET (the secret the gateway sends in
X-Gateway-Secret) or --gateway-jwks (the gateway's signed identity); with both, /v1
requests must carry both.
Logs JSON to standard error. Exports OpenTelemetry traces where OTEL_EXPORTER_OTLP_ENDPOINT
or OTEL_TRACES_EXPORTER says so. Stops gracefully on SIGINT or SIGTERM.`)
	var cfg serveConfig
	throttle := &cfg.api.LoginThrottle
	fs.StringVar(&cfg.addr, "addr", "127.0.0.1:9000", "`address` to listen on")
	fs.DurationVar(&cfg.api.SessionTTL, "session-ttl", httpapi.DefaultSessionTTL, "lifetime of a login `session`")
	prefixDefault := c.getenv("KEY_PREFIX")
	if prefixDefault == "" {
		prefixDefault = keystore.DefaultPrefix
	}
	prefix := fs.String("key-prefix", prefixDefault, "`prefix` of the API keys created, as configured in the gateway (env KEY_PREFIX)")
	fs.BoolVar(&cfg.api.SecureCookies, "secure-cookies", false, "mark the session cookie Secure even on plain-HTTP requests, for use behind a proxy that terminates TLS")
	trusted := fs.String("trusted-proxies", defaultTrustedProxies, "comma-separated `CIDRs` of the proxies whose X-Forwarded-For and X-Forwarded-Proto are believed (empty: none)")
	fs.DurationVar(&cfg.dbTimeout, "database-timeout", store.DefaultDatabaseTimeout, "bound on each database wait (pool acquire, statement); past it a request answers 503")
	fs.DurationVar(&cfg.purgeEvery, "purge-interval", httpapi.DefaultPurgeInterval, "how often expired sessions and old login attempts are deleted")
	fs.DurationVar(&cfg.rollupEvery, "usage-rollup-interval", httpapi.DefaultUsageRollupInterval, "how often the usage record's minutes are rolled up into hours and days, and its old rows deleted")
	fs.DurationVar(&throttle.Window, "login-window", store.DefaultLoginThrottle.Window, "sliding `window` in which failed logins are counted")
	fs.IntVar(&throttle.PerEmail, "login-failures-per-email", store.DefaultLoginThrottle.PerEmail, "failed logins allowed per (email, client address) in a window before 429")
	fs.IntVar(&throttle.PerClient, "login-failures-per-client", store.DefaultLoginThrottle.PerClient, "failed logins allowed per client address in a window, whatever the emails, before 429")
	fs.BoolVar(&cfg.api.Webhooks.AllowHTTP, "webhook-allow-http", false, "accept http:// webhook URLs, and --usage-export-url, as well as https:// ones (for tests)")
	fs.BoolVar(&cfg.api.Webhooks.AllowPrivate, "webhook-allow-private", false, "accept webhook and usage export destinations on loopback, private, link-local and multicast addresses (for tests and private networks)")
	fs.DurationVar(&cfg.webhookPoll, "webhook-poll-interval", webhook.DefaultPoll, "how often the webhook dispatcher looks for deliveries that are due")
	c.exportFlags(fs, &cfg.export)
	fs.BoolVar(&cfg.migrate, "migrate", false, "apply the database schema before serving (as `upstream migrate` does)")
	fs.StringVar(&cfg.api.LeakReportToken, "leak-report-token", c.getenv("LEAK_REPORT_TOKEN"), "bearer `token` of POST /security/leaked-keys, at least 32 characters (env LEAK_REPORT_TOKEN; default: the route is absent)")
	jwks := fs.String("gateway-jwks", c.getenv("GATEWAY_JWKS"), "the gateway's public keys, to verify the signed identity of /v1 requests (X-Gateway-Identity): a JWKS `URL` (http:// or https://, the gateway's /.well-known/jwks.json) or a PEM file (env GATEWAY_JWKS; default: none, GATEWAY_SECRET alone)")
	audience := fs.String("gateway-audience", gatewayauth.DefaultAudience, "the `aud` the gateway's identity assertions must carry (its identity_audience)")
	fs.StringVar(&cfg.adminAddr, "admin-addr", "", "`address` of /metrics, /healthz and /readyz, apart from --addr (default: not served)")
	if err := c.parse(fs, args); err != nil {
		return serveConfig{}, err
	}
	if err := cfg.checkBounds(); err != nil {
		return serveConfig{}, err
	}
	var err error
	if cfg.api.TrustedProxies, err = parseTrustedProxies(*trusted); err != nil {
		return serveConfig{}, usageErrorf("--trusted-proxies: %v", err)
	}
	if cfg.api.KeyFormat, err = keystore.NewFormat(*prefix); err != nil {
		return serveConfig{}, usageErrorf("--key-prefix: %v", err)
	}
	if cfg.dbURL, err = c.databaseURL(); err != nil {
		return serveConfig{}, err
	}
	cfg.api.GatewaySecret = c.getenv("GATEWAY_SECRET")
	if cfg.api.GatewaySecret == "" && *jwks == "" {
		return serveConfig{}, usageErrorf("neither GATEWAY_SECRET nor --gateway-jwks is set: set GATEWAY_SECRET to the gateway_secret of the gateway's configuration, or --gateway-jwks to its JWKS")
	}
	if cfg.api.Identity, err = identityVerifier(*jwks, *audience); err != nil {
		return serveConfig{}, usageErrorf("--gateway-jwks: %v", err)
	}
	if err := c.checkExport(&cfg.export, cfg.api.Webhooks); err != nil {
		return serveConfig{}, err
	}
	return cfg, nil
}

// checkBounds checks the numbers of cfg's flags. The first one out of bounds is the
// error.
func (cfg *serveConfig) checkBounds() error {
	throttle := cfg.api.LoginThrottle
	switch {
	case cfg.api.SessionTTL <= 0:
		return usageErrorf("--session-ttl must be positive")
	case cfg.dbTimeout <= 0:
		return usageErrorf("--database-timeout must be positive")
	case cfg.purgeEvery <= 0:
		return usageErrorf("--purge-interval must be positive")
	case cfg.rollupEvery <= 0:
		return usageErrorf("--usage-rollup-interval must be positive")
	case cfg.webhookPoll <= 0:
		return usageErrorf("--webhook-poll-interval must be positive")
	case throttle.Window <= 0:
		return usageErrorf("--login-window must be positive")
	case throttle.PerEmail <= 0 || throttle.PerClient <= 0:
		return usageErrorf("--login-failures-per-email and --login-failures-per-client must be positive")
	case cfg.api.LeakReportToken != "" && len(cfg.api.LeakReportToken) < httpapi.MinLeakReportToken:
		return usageErrorf("--leak-report-token must be at least %d characters", httpapi.MinLeakReportToken)
	}
	return checkExportBounds(cfg.export)
}

// identityVerifier returns the verifier of the gateway's identity assertions. jwks, a
// URL or a PEM file, holds the gateway's keys. The verifier is nil when jwks is empty.
func identityVerifier(jwks, audience string) (*gatewayauth.Verifier, error) {
	if jwks == "" {
		return nil, nil
	}
	cfg := gatewayauth.Config{KeyFile: jwks, Audience: audience}
	if strings.HasPrefix(jwks, "http://") || strings.HasPrefix(jwks, "https://") {
		cfg = gatewayauth.Config{JWKSURL: jwks, Audience: audience}
	}
	return gatewayauth.New(cfg)
}

// runServe serves cfg until c's context ends. The database pool, the admin endpoints,
// the purge and the usage roll-up live as long as the server.
func (c *cli) runServe(cfg serveConfig) error {
	logger := newLogger(c.stderr)
	defer func() { _ = logger.Sync() }()
	cfg.api.Logger = logger
	if s := cfg.api.GatewaySecret; s != "" && len(s) < 16 {
		logger.Warn("gateway secret is shorter than 16 characters")
	}
	if id := cfg.api.Identity; id != nil {
		defer id.Close()
		// The gateway may start after the upstream. A JWKS not there yet is fetched
		// again in the background, and when the first assertion comes.
		if err := id.Refresh(c.ctx); err != nil {
			logger.Warn("the gateway's JWKS could not be fetched yet; /v1 answers 503 until it can", zap.Error(err))
		}
	}
	if cfg.migrate {
		if err := schema.Migrate(c.ctx, cfg.dbURL); err != nil {
			return err
		}
	}
	traces, err := tracing.FromEnv(c.ctx, c.getenv, version.String())
	if err != nil {
		return err
	}
	defer c.flushTraces(traces, logger) // last: after the server and the jobs stopped
	cfg.api.Traces = traces
	pool, err := c.connect(0, cfg.dbTimeout, traces)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := checkSchema(c.ctx, pool); err != nil {
		return err
	}
	cfg.api.Pool = pool
	if cfg.adminAddr != "" {
		cfg.api.Metrics = httpapi.NewMetrics(pool)
	}
	srv, err := httpapi.NewServer(cfg.api)
	if err != nil {
		return err
	}
	if cfg.adminAddr != "" {
		stopAdmin, err := serveAdmin(cfg.adminAddr, pool, cfg.api.Metrics, logger)
		if err != nil {
			return err
		}
		defer stopAdmin()
	}
	// Both stop before the pool closes: defers run last first.
	defer c.background(func(ctx context.Context) { srv.RunPurge(ctx, cfg.purgeEvery) })()
	defer c.background(func(ctx context.Context) { srv.RunUsageRollup(ctx, cfg.rollupEvery) })()
	dispatcher := webhook.NewDispatcher(store.New(pool), keystore.New(pool, cfg.api.KeyFormat), cfg.api.Webhooks, logger, cfg.api.Metrics)
	dispatcher.Tracer = traces.Tracer(webhook.TracerName)
	defer c.background(func(ctx context.Context) { dispatcher.Run(ctx, cfg.webhookPoll) })()
	if cfg.export.URL != "" {
		exporter := usageexport.New(store.New(pool), cfg.export, logger, cfg.api.Metrics)
		exporter.Tracer = traces.Tracer(usageexport.TracerName)
		cfg.api.Metrics.WatchUsageExport(exporter.Lag)
		logger.Info("exporting usage", zap.String("host", exportHost(cfg.export.URL)),
			zap.Duration("delay", cfg.export.Delay), zap.Bool("signed", cfg.export.Secret != ""))
		defer c.background(exporter.Run)()
	}
	return c.listenAndServe(cfg, srv, logger)
}

// flushTraces sends the spans traces holds, if any, within shutdownTimeout.
func (c *cli) flushTraces(traces *tracing.Traces, logger *zap.Logger) {
	if traces == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := traces.Shutdown(ctx); err != nil {
		logger.Warn("sending the last spans", zap.Error(err))
	}
}

// background runs job until the returned stop is called. stop ends job's context and
// waits for it to return.
func (c *cli) background(job func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(c.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		job(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// shutdownTimeout is how long serve waits for the requests in flight after SIGINT or
// SIGTERM.
const shutdownTimeout = 15 * time.Second

// listenAndServe serves srv on cfg.addr until c's context ends, then shuts down
// gracefully within shutdownTimeout.
func (c *cli) listenAndServe(cfg serveConfig, srv *httpapi.Server, logger *zap.Logger) error {
	ln, err := net.Listen("tcp", cfg.addr)
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
	throttle := cfg.api.LoginThrottle
	logger.Info("serving", zap.String("addr", ln.Addr().String()),
		zap.String("key_prefix", cfg.api.KeyFormat.Prefix()), zap.Duration("session_ttl", cfg.api.SessionTTL),
		zap.Duration("database_timeout", cfg.dbTimeout), zap.Int32("pool_max_conns", cfg.api.Pool.Config().MaxConns),
		zap.Duration("login_window", throttle.Window), zap.Int("login_failures_per_email", throttle.PerEmail),
		zap.Int("login_failures_per_client", throttle.PerClient), zap.Bool("traces", cfg.api.Traces != nil))
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

// checkSchema fails when the database lacks the schema this code needs. Its message
// names the command that fixes it.
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

// newLogger returns a zap logger that writes JSON lines to w, at info level and above.
func newLogger(w io.Writer) *zap.Logger {
	enc := zap.NewProductionEncoderConfig()
	enc.TimeKey = "ts"
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	out := zapcore.Lock(zapcore.AddSync(w))
	return zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), out, zap.InfoLevel), zap.ErrorOutput(out))
}

// defaultTrustedProxies is serve's default --trusted-proxies: the loopback networks. A
// Caddy on the same machine connects from there.
const defaultTrustedProxies = "127.0.0.0/8,::1/128"

// parseTrustedProxies parses a comma-separated list of CIDR prefixes or bare
// addresses. A bare address is its own /32 or /128. An empty list trusts no proxy.
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

// serveAdmin serves httpapi.AdminHandler on addr until the returned stop is called.
// stop waits up to shutdownTimeout for the requests in flight.
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
