package caddymodule

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
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
	redisModeSingle   = "single"
	redisModeCluster  = "cluster"
	redisModeSentinel = "sentinel"
)

// newRedisClient builds the client redis_url describes in mode, with go-redis's own
// URL parsers (ParseURL, ParseClusterURL, ParseFailoverURL) and commandLimits.
// caFile, when set, is a PEM file of the CAs that rediss:// server certificates must
// chain to. It returns the client and the address to name in a log line.
func newRedisClient(mode, url, caFile string, timeout, dialTimeout time.Duration) (redis.UniversalClient, string, error) {
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
	case "", redisModeSingle:
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
	case redisModeCluster:
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
	case redisModeSentinel:
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
