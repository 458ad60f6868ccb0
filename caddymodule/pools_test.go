package caddymodule

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/internal/testkit/redistest"
	"github.com/keygate/keygate/internal/testkit/testenv"
)

// withParam adds a query parameter to a URL.
func withParam(u, name, value string) string {
	sep := "?"
	if strings.Contains(u, "?") {
		sep = "&"
	}
	return u + sep + name + "=" + value
}

// ownURL returns d's URL with an application_name no other test uses. The gateway
// shares a pool among the configs with the same settings. So this URL's pool is the
// test's own, and its connections can be told apart in pg_stat_activity.
func (d *db) ownURL(t testing.TB) string {
	return withParam(d.url, "application_name", randomName(t))
}

func randomName(t testing.TB) string {
	t.Helper()
	var b [6]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "kg_" + hex.EncodeToString(b[:])
}

// poolEntries returns the keys of pools.
func poolEntries() map[string]int {
	out := map[string]int{}
	pools.Range(func(key, _ any) bool {
		n, _ := pools.References(key)
		out[key.(string)] = n
		return true
	})
	return out
}

// sharedPool returns the pgxpool pools holds under url (whatever its conns.Setup), or nil.
func sharedPool(url string) *pgxpool.Pool {
	var p *pgxpool.Pool
	pools.Range(func(key, value any) bool {
		if strings.HasPrefix(key.(string), "postgres\x00"+url+"\x00") {
			p = value.(pgEntry).pool
		}
		return true
	})
	return p
}

// sharedRedis returns the Redis client pools holds under url and timeout, or nil. It
// looks for single mode, no CA file, and the default dial timeout and floor.
func sharedRedis(url string, timeout time.Duration) *redis.Client {
	var c *redis.Client
	pools.Range(func(key, value any) bool {
		if key == redisPoolKey("", url, "", timeout, conns.Setup{DialTimeout: defaultDialTimeout, MinConns: defaultRedisMinConns}) {
			c = value.(redisEntry).client.(*redis.Client)
		}
		return true
	})
	return c
}

func TestReloadSharesPoolsAndLeaksNoConnections(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	app := randomName(t)
	dbURL := withParam(d.url, "application_name", app)
	rURL := withParam(redisURL(t), "client_name", app)
	up := newUpstream(t)
	ctx := context.Background()

	pgConns := func() int {
		var n int
		if err := d.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1`, app).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	rdb := redistest.Client(t)
	redisConns := func() int {
		list, err := rdb.ClientList(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(list, "name="+app+" ")
	}

	gc := gatewayConfig{handler: gatewayOptions(dbURL, map[string]any{"redis_url": rURL}), upstream: up.addr()}
	gw := startGateway(t, gc)
	listen := strings.TrimPrefix(gw.base, "http://")
	load := func() {
		t.Helper()
		gw.reload(t, caddyConfig(listen, gw.logPath, gc))
	}
	busy := func() {
		t.Helper()
		// Concurrent requests, so that the pools hold several connections. The goroutines
		// report errors rather than call t.Fatal. That would end them without an answer, and
		// leave this loop waiting.
		done := make(chan string, 8)
		for range cap(done) {
			go func() {
				req, err := http.NewRequest(http.MethodGet, gw.base+"/v1/monitors", nil)
				if err != nil {
					done <- err.Error()
					return
				}
				req.Header.Set("Authorization", "Bearer "+key)
				// Caddy hands its listener over to the new config during a reload. A connection
				// caught in the handover is reset: a transport error, never an HTTP answer. Try such
				// a request again, for up to 2s: the handover is a moment, and resets for longer
				// fail the test.
				var res *http.Response
				if !testenv.Within(2*time.Second, func() bool {
					res, err = gw.client.Do(req)
					return err == nil
				}) {
					done <- err.Error()
					return
				}
				body, _ := io.ReadAll(res.Body)
				res.Body.Close()
				done <- fmt.Sprintf("%d %s", res.StatusCode, body)
			}()
		}
		for range cap(done) {
			if s := <-done; !strings.HasPrefix(s, "200 ") {
				t.Errorf("GET /v1/monitors during reloads: %s", s)
			}
		}
	}
	busy()
	pool := sharedPool(dbURL)
	if pool == nil {
		t.Fatalf("no shared pool for the database; pools: %v", poolEntries())
	}
	client := sharedRedis(rURL, defaultRedisTimeout)
	if client == nil {
		t.Fatalf("no shared Redis client; pools: %v", poolEntries())
	}
	pgBefore, redisBefore := pgConns(), redisConns()
	if pgBefore == 0 || redisBefore == 0 {
		t.Fatalf("connections before the reloads: postgres %d, redis %d", pgBefore, redisBefore)
	}

	for range 5 {
		load()
		busy()
	}
	if got := sharedPool(dbURL); got != pool {
		t.Error("a reload built a new PostgreSQL pool")
	}
	pgKey := postgresPoolKey(dbURL, conns.Setup{DialTimeout: defaultDialTimeout, MinConns: defaultLookupLanes + lookupOverflow + 1})
	redisKey := redisPoolKey("", rURL, "", defaultRedisTimeout, conns.Setup{DialTimeout: defaultDialTimeout, MinConns: defaultRedisMinConns})
	entries := poolEntries()
	if n := entries[pgKey]; n != 1 {
		t.Errorf("postgres pool references after the reloads: %d, want 1", n)
	}
	if n := entries[redisKey]; n != 1 {
		t.Errorf("redis client references after the reloads: %d, want 1 (%v)", n, entries)
	}
	if got := sharedRedis(rURL, defaultRedisTimeout); got != client {
		t.Error("a reload built a new Redis client")
	}
	// Pools grow with demand, up to their size; one pool per reload would not fit.
	if pg, r := pgConns(), redisConns(); pg > int(pool.Config().MaxConns) || r > client.Options().PoolSize {
		t.Errorf("connections after 5 reloads: postgres %d (before %d, pool size %d), redis %d (before %d, pool size %d)",
			pg, pgBefore, pool.Config().MaxConns, r, redisBefore, client.Options().PoolSize)
	}

	// A config without the gateway lets go of everything: connections closed.
	gw.reload(t, caddyConfig(listen, gw.logPath, gatewayConfig{upstream: up.addr()}))
	entries = poolEntries()
	if _, ok := entries[pgKey]; ok {
		t.Errorf("the postgres pool outlived its last handler: %v", entries)
	}
	if _, ok := entries[redisKey]; ok {
		t.Errorf("the redis client outlived its last handler: %v", entries)
	}
	testenv.Eventually(t, 5*time.Second, "every connection closed", func() bool { return pgConns() == 0 && redisConns() == 0 })
}

func TestChangedSettingsBuildANewPool(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	up := newUpstream(t)
	first := d.ownURL(t)
	second := d.ownURL(t)

	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(first, nil), upstream: up.addr()})
	gw.get(t, "/v1/me", key)
	listen := strings.TrimPrefix(gw.base, "http://")
	gw.reload(t, caddyConfig(listen, gw.logPath, gatewayConfig{handler: gatewayOptions(second, nil), upstream: up.addr()}))
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if sharedPool(first) != nil {
		t.Error("the pool of the old URL is still open")
	}
	if sharedPool(second) == nil {
		t.Error("no pool for the new URL")
	}
}

func TestThePoolKeepsAWarmConnectionForEveryBatchInFlight(t *testing.T) {
	// While PostgreSQL is slow, a batch that has waited a tenth of database_timeout for
	// a lane goes out on its own (keystore.Batcher). So up to nine overlap the lanes'.
	// Each must find a connection open: opening one takes several round trips. So the
	// pool keeps lookup_lanes + 10 open; the last_used_at writes need one. It grows past
	// pgxpool's default size (4, or the number of CPUs) for them. A pool_max_conns in the
	// URL is kept, and the log says what it costs.
	d := newDB(t)
	up := newUpstream(t)
	pgxDefault := int32(max(4, runtime.NumCPU()))
	for _, tc := range []struct {
		name        string
		params      string
		opts        map[string]any
		min, max    int32 // max 0: pgxpool's default size or min, whichever is larger
		wantWarning bool
	}{
		{"defaults", "", nil, 11, 0, false},
		{"three lanes", "", map[string]any{"lookup_lanes": 3}, 13, 0, false},
		{"a larger pool", "&pool_max_conns=20", nil, 11, 20, false},
		{"a smaller pool", "&pool_max_conns=5", nil, 5, 5, true},
		{"database_min_conns", "", map[string]any{"database_min_conns": 6}, 6, 0, false},
		{"unbatched", "", map[string]any{"disable_lookup_batching": true}, 4, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := d.ownURL(t) + tc.params
			gw := startGateway(t, gatewayConfig{handler: gatewayOptions(url, tc.opts), upstream: up.addr()})
			pool := sharedPool(url)
			if pool == nil {
				t.Fatalf("no shared pool; pools: %v", poolEntries())
			}
			wantMax := tc.max
			if wantMax == 0 {
				wantMax = max(pgxDefault, tc.min)
			}
			if cfg := pool.Config(); cfg.MinConns != tc.min || cfg.MaxConns != wantMax {
				t.Errorf("the pool keeps %d of %d connections open, want %d of %d", cfg.MinConns, cfg.MaxConns, tc.min, wantMax)
			}
			if warned := strings.Contains(gw.logText(t), "pool_max_conns is below database_min_conns"); warned != tc.wantWarning {
				t.Errorf("warning logged: %v, want %v", warned, tc.wantWarning)
			}
		})
	}
}

// TestThePoolsConnectionsDoNotAllRetireTogether: the floor's connections open together,
// so their lifetimes get a jitter of a quarter of theirs, unless the URL sets one.
func TestThePoolsConnectionsDoNotAllRetireTogether(t *testing.T) {
	d := newDB(t)
	up := newUpstream(t)
	for _, tc := range []struct {
		params   string
		lifetime time.Duration
		jitter   time.Duration
	}{
		{"", time.Hour, 15 * time.Minute},
		{"&pool_max_conn_lifetime=20m", 20 * time.Minute, 5 * time.Minute},
		{"&pool_max_conn_lifetime_jitter=0s", time.Hour, 0},
		{"&pool_max_conn_lifetime_jitter=2m", time.Hour, 2 * time.Minute},
	} {
		t.Run(tc.params, func(t *testing.T) {
			url := d.ownURL(t) + tc.params
			startGateway(t, gatewayConfig{handler: gatewayOptions(url, nil), upstream: up.addr()})
			pool := sharedPool(url)
			if pool == nil {
				t.Fatalf("no shared pool; pools: %v", poolEntries())
			}
			if cfg := pool.Config(); cfg.MaxConnLifetime != tc.lifetime || cfg.MaxConnLifetimeJitter != tc.jitter {
				t.Errorf("lifetime %v, jitter %v; want %v, %v", cfg.MaxConnLifetime, cfg.MaxConnLifetimeJitter, tc.lifetime, tc.jitter)
			}
		})
	}
}

func TestInvalidConfigIsRefusedAtLoad(t *testing.T) {
	d := newDB(t)
	up := newUpstream(t)
	before := len(poolEntries())
	for _, tc := range []struct {
		name string
		opts map[string]any
		want string
	}{
		{"no database_url", map[string]any{"database_url": nil}, "database_url is required"},
		{"database_url from an unset variable", map[string]any{"database_url": "{env.KG_TEST_UNSET_VARIABLE}"}, "database_url \"{env.KG_TEST_UNSET_VARIABLE}\" is empty"},
		{"database_url not a URL", map[string]any{"database_url": "postgres://%zz"}, "parsing database_url"},
		{"database_read_urls not a URL", map[string]any{"database_read_urls": []any{"postgres://%zz"}}, "parsing database_read_urls"},
		{"neither gateway_secret nor identity_key", map[string]any{"gateway_secret": nil}, "gateway_secret or identity_key is required"},
		{"gateway_secret from an unset variable", map[string]any{"gateway_secret": "{env.KG_TEST_UNSET_VARIABLE}"}, "gateway_secret \"{env.KG_TEST_UNSET_VARIABLE}\" is empty"},
		{"gateway_secret with a newline", map[string]any{"gateway_secret": "abc\ndef"}, "gateway_secret must be a valid header value"},
		{"key_prefix uppercase", map[string]any{"key_prefix": "Mon"}, `key_prefix "Mon": must match [a-z][a-z0-9]{0,15}`},
		{"key_prefix too long", map[string]any{"key_prefix": "abcdefghijklmnopq"}, "key_prefix"},
		{"key_prefix with an underscore", map[string]any{"key_prefix": "mon_x"}, "key_prefix"},
		{"limiter_failure unknown", map[string]any{"limiter_failure": "sometimes"}, `limiter_failure "sometimes": must be open, closed or local`},
		{"redis_url not redis", map[string]any{"redis_url": "http://localhost:6379"}, "parsing redis_url"},
		{"negative database_timeout", map[string]any{"database_timeout": "-1s"}, "database_timeout -1s: must be positive"},
		{"batch_linger over a tenth of redis_timeout", map[string]any{"batch_linger": "21ms"}, "batch_linger 21ms: must be at most a tenth of database_timeout (2s) and of redis_timeout (200ms)"},
		{"batch_linger over a tenth of database_timeout", map[string]any{"batch_linger": "15ms", "database_timeout": "100ms"}, "batch_linger 15ms: must be at most a tenth of database_timeout (100ms)"},
		{"negative batch_linger", map[string]any{"batch_linger": "-1ms"}, "batch_linger -1ms: must be at most a tenth"},
		{"empty strip_fields name", map[string]any{"strip_fields": []any{"config", ""}}, "strip_fields: names must not be empty"},
		{"unknown option", map[string]any{"databse_url": "x"}, `unknown field "databse_url"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := caddyConfig(freeAddr(t), t.TempDir()+"/caddy.log", gatewayConfig{handler: gatewayOptions(d.url, tc.opts), upstream: up.addr()})
			err := caddy.Load(cfg, true)
			if err == nil {
				caddy.Stop()
				t.Fatal("the config loaded")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
	if after := len(poolEntries()); after != before {
		t.Errorf("refused configs left %d pool entries behind: %v", after-before, poolEntries())
	}
}

func TestPlaceholdersAreReplaced(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	up := newUpstream(t)
	t.Setenv("KG_TEST_DATABASE_URL", d.url)
	t.Setenv("KG_TEST_REDIS_URL", redisURL(t))
	t.Setenv("KG_TEST_SECRET", "from-the-environment")
	gw := startGateway(t, gatewayConfig{
		handler: map[string]any{
			"database_url":   "{env.KG_TEST_DATABASE_URL}",
			"redis_url":      "{env.KG_TEST_REDIS_URL}",
			"gateway_secret": "{env.KG_TEST_SECRET}",
		},
		upstream: up.addr(),
	})
	res, body := gw.get(t, "/v1/echo", key)
	if res.StatusCode != http.StatusOK || !strings.Contains(string(body), `"X-Gateway-Secret":["from-the-environment"]`) {
		t.Errorf("%d %s", res.StatusCode, body)
	}
	if res.Header.Get("Ratelimit") == "" {
		t.Error("no RateLimit header: redis_url not used")
	}
}

func TestMalformedRedisURLErrorsHideThePassword(t *testing.T) {
	d := newDB(t)
	up := newUpstream(t)
	for _, url := range []string{
		"redis://user:hunter2pw@127.0.0.1:notaport/0",
		"redis://:hunter2pw@127.0.0.1:6379/abc",
		"redis://user:hunter2pw@127.0.0.1:6379/0?dial_timeout=zz",
		"redis://:hunter2pw@h ost:1/0",
		"redis://user:hunter2pw@[::1/0",
		"redis://us%zzer:hunter2pw@h/0",
		"redis://:hunter2%7Cpw@h ost:1/0",
		"redis://:hunter2/pw@127.0.0.1:notaport/0",
	} {
		t.Run(url, func(t *testing.T) {
			cfg := caddyConfig(freeAddr(t), t.TempDir()+"/caddy.log", gatewayConfig{
				handler: gatewayOptions(d.url, map[string]any{"redis_url": url}), upstream: up.addr(),
			})
			err := caddy.Load(cfg, true)
			if err == nil {
				caddy.Stop()
				t.Fatal("the config loaded")
			}
			if !strings.Contains(err.Error(), "parsing redis_url") {
				t.Errorf("error %q does not say what failed", err)
			}
			for _, pw := range []string{"hunter2", "%7C"} {
				if strings.Contains(err.Error(), pw) {
					t.Errorf("error %q shows the password", err)
				}
			}
		})
	}
}
