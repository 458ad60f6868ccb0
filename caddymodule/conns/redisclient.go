package conns

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
)

// commandLimits returns the settings that bound every command of a client, in every
// redis_mode. timeout bounds each part: the wait for a pooled connection, the write,
// the read. The caller's context deadline is honoured as well. There are no retries
// (MaxRetries -1) and one dial attempt per command (DialerRetries 1). So a Redis that
// hangs costs a request one timeout, not several. dialTimeout bounds a dial: a
// request's dial by its own deadline as well, the warmer's by dialTimeout alone.
func commandLimits(timeout, dialTimeout time.Duration) (dial, read, write, pool time.Duration, contextTimeout bool, maxRetries, dialerRetries int) {
	return dialTimeout, timeout, timeout, timeout, true, -1, 1
}

// The values of redis_mode.
const (
	RedisSingle   = "single"
	RedisCluster  = "cluster"
	RedisSentinel = "sentinel"
)

// NewRedisClient builds the client redis_url describes in mode, with go-redis's own
// URL parsers (ParseURL, ParseClusterURL, ParseFailoverURL) and commandLimits.
// caFile, when set, is a PEM file of the CAs that rediss:// server certificates must
// chain to. It returns the client and the address to name in a log line.
func NewRedisClient(mode, url, caFile string, timeout, dialTimeout time.Duration) (redis.UniversalClient, string, error) {
	var pool *x509.CertPool
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, "", fmt.Errorf("redis_tls_ca: %v", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("redis_tls_ca %s: no PEM certificate in the file", caFile)
		}
	}
	withCA := func(c *tls.Config) error {
		if pool == nil {
			return nil
		}
		if c == nil {
			return fmt.Errorf("redis_tls_ca is set but redis_url is not rediss://")
		}
		c.RootCAs = pool
		return nil
	}
	switch mode {
	case "", RedisSingle:
		opts, err := redis.ParseURL(url)
		if err != nil {
			return nil, "", fmt.Errorf("parsing redis_url: %v", err)
		}
		if err := withCA(opts.TLSConfig); err != nil {
			return nil, "", err
		}
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout,
			opts.ContextTimeoutEnabled, opts.MaxRetries, opts.DialerRetries = commandLimits(timeout, dialTimeout)
		return redis.NewClient(opts), opts.Addr, nil
	case RedisCluster:
		opts, err := redis.ParseClusterURL(url)
		if err != nil {
			return nil, "", fmt.Errorf("parsing redis_url (cluster): %v", err)
		}
		if err := withCA(opts.TLSConfig); err != nil {
			return nil, "", err
		}
		// MOVED/ASK redirects still follow without retries (MaxRedirects).
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout,
			opts.ContextTimeoutEnabled, opts.MaxRetries, opts.DialerRetries = commandLimits(timeout, dialTimeout)
		return redis.NewClusterClient(opts), strings.Join(opts.Addrs, ","), nil
	case RedisSentinel:
		opts, err := redis.ParseFailoverURL(url)
		if err != nil {
			return nil, "", fmt.Errorf("parsing redis_url (sentinel): %v", err)
		}
		if opts.MasterName == "" {
			return nil, "", fmt.Errorf("redis_url: redis_mode sentinel needs ?master_name=<name> in the URL")
		}
		if err := withCA(opts.TLSConfig); err != nil {
			return nil, "", err
		}
		opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout,
			opts.ContextTimeoutEnabled, opts.MaxRetries, opts.DialerRetries = commandLimits(timeout, dialTimeout)
		return redis.NewFailoverClient(opts), strings.Join(opts.SentinelAddrs, ","), nil
	default:
		return nil, "", fmt.Errorf("redis_mode %q: must be single, cluster or sentinel", mode)
	}
}

// OpenRedis builds the client of url in mode (NewRedisClient), pings it, and starts
// the warmer of its pool. A Redis that does not answer is a warning, not an error:
// limiter_failure applies until it does. Commands are not retried: a dead Redis
// costs a request one timeout, not several. timeout bounds every part of a command;
// setup's DialTimeout bounds a dial (commandLimits).
func OpenRedis(mode, url, caFile string, timeout time.Duration, setup Setup, logger *zap.Logger) (redis.UniversalClient, *RedisWarmer, error) {
	client, addr, err := NewRedisClient(mode, url, caFile, timeout, setup.DialTimeout)
	if err != nil {
		// Unlike pgx's, go-redis's errors may quote the URL, password and all.
		return nil, nil, errors.New(redactUserinfo(err.Error(), url))
	}
	ctx, cancel := context.WithTimeout(context.Background(), setup.DialTimeout+timeout)
	defer cancel()
	if err := client.Ping(ctx).Err(); err != nil {
		logger.Warn("redis did not answer at start; limiter_failure applies until it does",
			zap.String("mode", mode), zap.String("addr", addr), zap.Error(err))
	}
	return client, StartRedisWarmer(client, setup.MinConns, setup.DialTimeout+timeout), nil
}

// redactUserinfo removes from msg the user information of rawURL (user:password).
// It removes it whole, its password alone, and every piece of it, raw or escaped.
// go-redis's errors may quote a URL, password and all.
func redactUserinfo(msg, rawURL string) string {
	// Everything up to the last @ is taken for user information. A password with an
	// unescaped / or @ makes the URL ambiguous. Too much redacted beats too little.
	_, rest, ok := strings.Cut(rawURL, "://")
	if !ok {
		rest = rawURL
	}
	at := strings.LastIndex(rest, "@")
	if at < 0 {
		return msg
	}
	userinfo := rest[:at]
	secrets := []string{userinfo}
	if _, password, ok := strings.Cut(userinfo, ":"); ok && password != "" {
		secrets = append(secrets, password, keystore.PercentDecode(password))
	}
	// A parser that misreads the URL may quote any piece of it: a password with a /
	// in it becomes a host and a port.
	for _, piece := range strings.FieldsFunc(userinfo, func(r rune) bool { return strings.ContainsRune(":/@?#", r) }) {
		if len(piece) >= 3 {
			secrets = append(secrets, piece)
		}
	}
	for _, s := range secrets {
		if s == "" {
			continue
		}
		msg = strings.ReplaceAll(msg, s, "xxxxx")
		msg = strings.ReplaceAll(msg, strconv.Quote(s)[1:len(strconv.Quote(s))-1], "xxxxx")
	}
	return msg
}
