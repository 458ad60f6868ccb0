package caddymodule

// Slow and hung dependencies (docs/dependencies.md), against the real PostgreSQL and
// Redis, made slow or hung by internal/testkit/latencyproxy. Its hang mode stands in for
// SIGSTOP. Nothing is forwarded until Resume, and what was sent meanwhile is
// delivered then. But the servers other packages' tests share are left alone.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/caddymodule/conns"
	"github.com/keygate/keygate/internal/testkit/latencyproxy"
	"github.com/keygate/keygate/internal/testkit/redistest"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/keystore/keystoretest"
	"github.com/keygate/keygate/schema/schematest"
)

func newLatencyProxy(t *testing.T, target string) *latencyproxy.Proxy {
	t.Helper()
	p, err := latencyproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// slowGateway starts a gateway with a test upstream. Its PostgreSQL (d's database,
// dbParams appended to its URL) and Redis answer through latency proxies. They delay
// them by pgDelay and rdDelay from before the gateway starts. options are the
// handler's other options. The Redis is the test's own (redistest.Own): a SCRIPT FLUSH
// of the shared one by another package's test would cost a round trip that a Redis
// this slow has no room for.
func slowGateway(t *testing.T, d *db, dbParams string, pgDelay, rdDelay time.Duration, options map[string]any) (gw *gateway, pg, rd *latencyproxy.Proxy) {
	t.Helper()
	pg = newLatencyProxy(t, hostOf(t, d.url))
	redisURL := redistest.Own(t)
	rd = newLatencyProxy(t, hostOf(t, redisURL))
	pg.SetDelay(pgDelay)
	rd.SetDelay(rdDelay)
	options["redis_url"] = withHost(t, redisURL, rd.Addr())
	gw = startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, pg.Addr())+dbParams, options),
		upstream: newUpstream(t).addr(),
	})
	return gw, pg, rd
}

// statuses sends n concurrent GETs and counts their statuses. It also counts the
// 200s that came without RateLimit headers: let through uncounted.
func statuses(t *testing.T, gw *gateway, n int, path, key string) (byStatus map[int]int, uncounted int) {
	t.Helper()
	var mu sync.Mutex
	byStatus = map[int]int{}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _ := gw.get(t, path, key)
			mu.Lock()
			defer mu.Unlock()
			byStatus[res.StatusCode]++
			if res.StatusCode == http.StatusOK && res.Header.Get("Ratelimit") == "" {
				uncounted++
			}
		}()
	}
	wg.Wait()
	return byStatus, uncounted
}

func TestSlowDependenciesInsideTheirTimeoutsAreExact(t *testing.T) {
	// PostgreSQL and Redis both answer in a bit more than half their timeouts, from
	// before the gateway starts. The gateway opens its connections by itself, under
	// load. Then a limit of 20 lets exactly 20 of 60 concurrent requests through, every
	// one counted. No request answers 503.
	d := newDB(t)
	d.plan("small", 20)
	key, _ := d.key(d.org("small"), keystore.RoleEditor)
	loadKey, _ := d.key(d.org("pro"), keystore.RoleEditor)
	gw, _, _ := slowGateway(t, d, "&pool_max_conns=8", 800*time.Millisecond, 550*time.Millisecond,
		map[string]any{"database_timeout": "1500ms", "redis_timeout": "1s"})
	steadyWithin(t, gw, loadKey, 8, 10*time.Second)
	awayFromWindowEdge(t, 12*time.Second)
	got, uncounted := statuses(t, gw, 60, "/v1/me", key)
	if got[http.StatusOK] != 20 || got[http.StatusTooManyRequests] != 40 || uncounted != 0 {
		t.Errorf("statuses %v, %d let through uncounted; want 20 200s and 40 429s, all counted", got, uncounted)
	}
}

func TestHungPostgresAnswers503AtOnceAndRecovers(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	pg := newLatencyProxy(t, hostOf(t, d.url))
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, pg.Addr()), map[string]any{"database_timeout": "300ms"}),
		upstream: up.addr(),
	})
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("before the hang: %d %s", res.StatusCode, body)
	}
	pg.Hang()
	for range conns.BreakerThreshold {
		res, body := gw.get(t, "/v1/me", key)
		wantJSONError(t, res, body, http.StatusServiceUnavailable, wantUnavailable)
	}
	// The breaker is open: answers come at once.
	for range 20 {
		var res *http.Response
		var body []byte
		took := timed(func() { res, body = gw.get(t, "/v1/me", key) })
		wantJSONError(t, res, body, http.StatusServiceUnavailable, wantUnavailable)
		if took > 100*time.Millisecond {
			t.Errorf("a 503 took %v with the breaker open; want it at once", took)
		}
	}
	pg.Resume()
	testenv.Eventually(t, 5*time.Second, "a 200 once PostgreSQL answers again", func() bool {
		res, _ := gw.get(t, "/v1/me", key)
		return res.StatusCode == http.StatusOK
	})
	if log := gw.logText(t); !strings.Contains(log, "circuit breaker open") || !strings.Contains(log, "circuit breaker closed") {
		t.Errorf("the breaker's changes were not logged:\n%s", log)
	}
}

func TestHungRedisFollowsLimiterFailureAtOnceAndRecovers(t *testing.T) {
	d := newDB(t)
	d.plan("small", 30)
	up := newUpstream(t)
	for _, tc := range []struct {
		policy  string
		status  int
		headers bool // RateLimit headers while Redis hangs
	}{
		{"open", http.StatusOK, false},
		{"closed", http.StatusServiceUnavailable, false},
		{"local", http.StatusOK, true},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			key, _ := d.key(d.org("small"), keystore.RoleEditor)
			rd := newLatencyProxy(t, hostOf(t, redisURL(t)))
			gw := startGateway(t, gatewayConfig{
				handler: gatewayOptions(d.url, map[string]any{
					"redis_url": withHost(t, redisURL(t), rd.Addr()), "redis_timeout": "200ms", "limiter_failure": tc.policy,
				}),
				upstream: up.addr(),
			})
			awayFromWindowEdge(t, 15*time.Second)
			res, _ := gw.get(t, "/v1/me", key)
			checkRateLimitHeaders(t, res, 30, 29)

			rd.Hang()
			for range conns.BreakerThreshold {
				if res, body := gw.get(t, "/v1/me", key); res.StatusCode != tc.status {
					t.Errorf("while Redis hangs: %d %s, want %d", res.StatusCode, body, tc.status)
				}
			}
			for i := range 10 {
				var res *http.Response
				took := timed(func() { res, _ = gw.get(t, "/v1/me", key) })
				if res.StatusCode != tc.status || (res.Header.Get("Ratelimit") != "") != tc.headers {
					t.Errorf("breaker open: %d %q, want %d with headers %v", res.StatusCode, res.Header, tc.status, tc.headers)
				}
				if tc.headers {
					// Counted in process from zero: the hang's first requests and these.
					checkRateLimitHeaders(t, res, 30, 30-conns.BreakerThreshold-i-1)
				}
				if took > 100*time.Millisecond {
					t.Errorf("took %v with the breaker open; want it at once", took)
				}
			}
			if tc.policy == "local" {
				// The same limit holds in process: 30 in all, then 429.
				got, _ := statuses(t, gw, 20, "/v1/me", key)
				if got[http.StatusOK] != 30-conns.BreakerThreshold-10 || got[http.StatusTooManyRequests] != 20-(30-conns.BreakerThreshold-10) {
					t.Errorf("local counting: %v", got)
				}
			}
			rd.Resume()
			// Back on Redis: its count goes on from the one request counted before the hang.
			// The counts the hang held back reach Redis on resume, late, and the script refuses
			// them. Had they been written, fewer would remain.
			var first *http.Response
			testenv.Eventually(t, 5*time.Second, "a 200 with the budget untouched", func() bool {
				res, _ := gw.get(t, "/v1/me", key)
				if res.StatusCode == http.StatusOK && remainingOf(res) >= 20 {
					first = res
				}
				return first != nil
			})
			if rem := remainingOf(first); rem != 28 {
				t.Errorf("first count on Redis after the hang leaves %d, want 28", rem)
			}
		})
	}
}

// remainingOf reads r= of the RateLimit header; -1 without one.
func remainingOf(res *http.Response) int {
	v := res.Header.Get("Ratelimit")
	_, after, ok := strings.Cut(v, ";r=")
	if !ok {
		return -1
	}
	n, err := strconv.Atoi(strings.SplitN(after, ";", 2)[0])
	if err != nil {
		return -1
	}
	return n
}

func TestNoModuleLogLineShowsAKey(t *testing.T) {
	// Every line the module writes about a request, with the key in the path
	// (percent-encoded) and in the query string.
	d, key, _ := newDBWithKey(t)
	_, secret, _ := strings.Cut(key, ".")
	encoded := strings.NewReplacer("_", "%5F", ".", "%2E").Replace(key)
	inPath := strings.ReplaceAll(key, "_", "%5F") // an encoded dot is no path's (routetable.CheckTarget)
	up := newUpstream(t)
	pg := newLatencyProxy(t, hostOf(t, d.url))
	live := startGateway(t, gatewayConfig{
		handler: gatewayOptions(withHost(t, d.url, pg.Addr()), map[string]any{
			"database_timeout": "200ms", "redis_url": withHost(t, redisURL(t), freeAddr(t)), "redis_timeout": "100ms",
		}),
		upstream: up.addr(),
	})
	for _, tc := range []struct {
		gw       *gateway
		path     string
		before   func()
		wantLine string
	}{
		{live, "/v1/truncated-json?api_key=" + key + "&k=" + encoded, nil, "aborting a response the JSON filter could not complete"},
		{live, "/v1/compressed/br/" + inPath + "?api_key=" + key, nil, "unsupported content encoding"},
		{live, "/v1/me?api_key=" + key, nil, "rate limiter failed"},
		{live, "/v1/monitors/" + inPath + "?api_key=" + key, up.Close, "upstream failed"},
		{live, "/v1/me?api_key=" + key, pg.Hang, "key lookup failed"},
	} {
		if tc.before != nil {
			tc.before()
		}
		if res, err := tc.gw.client.Do(mustRequest(t, tc.gw.base+tc.path, key)); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
		testenv.Eventually(t, 5*time.Second, "a "+tc.wantLine+" line", func() bool {
			return strings.Contains(tc.gw.logText(t), tc.wantLine)
		})
	}
	pg.Resume()
	// The module's own lines. Caddy's lines (the reverse proxy's, the access log) are
	// the log filter's job, tested with the example Caddyfile.
	var log string
	for _, line := range strings.Split(live.logText(t), "\n") {
		if strings.Contains(line, `"logger":"http.handlers.v1_gateway"`) {
			log += line + "\n"
		}
	}
	for _, leak := range []string{secret, secret[:16], strings.ReplaceAll(secret, "_", "%5F")[:16]} {
		if strings.Contains(log, leak) {
			t.Errorf("the log shows %q:\n%s", leak, log)
		}
	}
}

func TestALateLookupKeepsItsConnection(t *testing.T) {
	// A lookup whose context ends while its answer is on the way. With pgx's default,
	// the connection is broken, and the next lookup dials a new one: several round trips
	// on a slow database. With conns.TunePostgres's CancelRequest handling, the connection
	// survives when the answer comes within a quarter timeout more.
	d, key, _ := newDBWithKey(t)
	pg := newLatencyProxy(t, hostOf(t, d.url))
	for _, tc := range []struct {
		name      string
		tune      bool
		wantDials int64
	}{
		{"pgx default", false, 2},
		{"tuned", true, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := pgxpool.ParseConfig(withHost(t, d.url, pg.Addr()))
			if err != nil {
				t.Fatal(err)
			}
			cfg.MaxConns = 1
			if tc.tune {
				conns.TunePostgres(cfg, 400*time.Millisecond, conns.Setup{DialTimeout: time.Second}) // a grace of 100ms
			}
			pool := schematest.OpenPool(t, cfg)
			store := keystore.New(pool, keystoretest.Format(t, "mon"))
			pg.SetDelay(0)
			if _, ok, err := store.Verify(context.Background(), key); !ok || err != nil {
				t.Fatalf("warm lookup: %v %v", ok, err)
			}
			pg.SetDelay(300 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
			// Tuned, the answer may still be taken, up to a quarter timeout late.
			_, _, _ = store.Verify(ctx, key)
			cancel()
			pg.SetDelay(0)
			testenv.Eventually(t, 10*time.Second, "the given-up lookup's connection back in the pool or closed", func() bool {
				st := pool.Stat()
				return st.AcquiredConns() == 0 && st.ConstructingConns() == 0
			})
			if _, ok, err := store.Verify(context.Background(), key); !ok || err != nil {
				t.Fatalf("lookup after: %v %v", ok, err)
			}
			if n := pool.Stat().NewConnsCount(); n != tc.wantDials {
				t.Errorf("%d connections dialled, want %d", n, tc.wantDials)
			}
		})
	}
}

func TestAHungPostgresCostsALoneRequestItsDatabaseTimeoutNotMore(t *testing.T) {
	// Lone requests, one after the other. Batched, each lookup runs inline on its
	// request's goroutine (keystore.Batcher). It must end at database_timeout, not a
	// grace later, as a batch's cancelled query may (conns.TunePostgres: a quarter timeout,
	// here 200ms). With disable_lookup_batching, database_timeout bounds the Store's
	// lookup (storeWithin). Its cancelled query keeps its connection for that grace. So
	// a 503 comes between the two, never later.
	const timeout = 800 * time.Millisecond
	d, key, _ := newDBWithKey(t)
	for _, tc := range []struct {
		name    string
		options map[string]any
		most    time.Duration
	}{
		{"batched", map[string]any{"database_timeout": "800ms"}, timeout},
		{"unbatched", map[string]any{"database_timeout": "800ms", "disable_lookup_batching": true}, timeout * 5 / 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pg := newLatencyProxy(t, hostOf(t, d.url))
			gw := startGateway(t, gatewayConfig{
				handler:  gatewayOptions(withHost(t, d.url, pg.Addr()), tc.options),
				upstream: newUpstream(t).addr(),
			})
			if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
				t.Fatalf("before the hang: %d %s", res.StatusCode, body)
			}
			pg.Hang()
			defer pg.Resume()
			// Each 503 comes no sooner than the timeout and never a second late. The bound
			// itself is judged on the median: a grace too many delays every request, while a
			// busy machine's scheduler delays one now and then.
			took := make([]time.Duration, conns.BreakerThreshold)
			for i := range took {
				var res *http.Response
				var body []byte
				took[i] = timed(func() { res, body = gw.get(t, "/v1/me", key) })
				wantJSONError(t, res, body, http.StatusServiceUnavailable, wantUnavailable)
				if took[i] < timeout || took[i] > tc.most+time.Second {
					t.Errorf("request %d: the 503 took %v; want database_timeout (%v), at most %v", i, took[i], timeout, tc.most)
				}
			}
			slices.Sort(took)
			if median := took[len(took)/2]; median > tc.most+120*time.Millisecond {
				t.Errorf("the 503s took %v: a median of %v; want database_timeout (%v), at most %v", took, median, timeout, tc.most)
			}
		})
	}
}

func TestAColdStartBehindSlowDependenciesReachesAnExactSteadyState(t *testing.T) {
	// The gateway starts while PostgreSQL answers at 40% of database_timeout and Redis
	// at 65% of redis_timeout, and nothing opens a connection for it. Opening one takes
	// more round trips than one request's timeout holds: the startup and statement
	// preparation; HELLO, CLIENT SETINFO, the scripts and the clock. Within 10 s of load
	// the gateway counts every request exactly and answers no 503. It does again after
	// both drop every connection, as when they restart behind the slow link.
	d := newDB(t)
	d.plan("small", 20)
	loadKey, _ := d.key(d.org("pro"), keystore.RoleEditor)
	gw, pg, rd := slowGateway(t, d, "", 800*time.Millisecond, 130*time.Millisecond,
		map[string]any{"database_timeout": "2s", "redis_timeout": "200ms"})
	for _, phase := range []string{"cold start", "after a restart"} {
		if phase == "after a restart" {
			pg.Drop()
			rd.Drop()
			// A restarted Redis has lost its scripts too.
			flush := redistest.Connect(t, "redis://"+rd.Target())
			if err := flush.ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if !steadyWithin(t, gw, loadKey, 8, 10*time.Second) {
			t.Logf("%s: answers still not all counted 200s after 10 s of load", phase)
		}
		key, _ := d.key(d.org("small"), keystore.RoleEditor)
		awayFromWindowEdge(t, 8*time.Second)
		got, uncounted := statuses(t, gw, 60, "/v1/me", key)
		if got[http.StatusOK] != 20 || got[http.StatusTooManyRequests] != 40 || uncounted != 0 {
			t.Errorf("%s: statuses %v, %d let through uncounted; want 20 200s and 40 429s, all counted", phase, got, uncounted)
		}
	}
}

// steadyWithin sends GET /v1/me with key from clients concurrent clients. Each sends
// its next request when its last is answered. It stops when the last 3*clients
// answers in a row were 200s that were counted (RateLimit headers), or when limit
// passes. It reports whether they were.
func steadyWithin(t *testing.T, gw *gateway, key string, clients int, limit time.Duration) bool {
	t.Helper()
	var (
		mu     sync.Mutex
		streak int
		steady = make(chan struct{})
		once   sync.Once
	)
	deadline := time.Now().Add(limit)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				select {
				case <-steady:
					return
				default:
				}
				res, _ := gw.get(t, "/v1/me", key)
				mu.Lock()
				if res.StatusCode == http.StatusOK && res.Header.Get("Ratelimit") != "" {
					streak++
				} else {
					streak = 0
				}
				if streak >= 3*clients {
					once.Do(func() { close(steady) })
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	select {
	case <-steady:
		return true
	default:
		return false
	}
}

func TestGoRedisThrowsAwayAConnectionWhoseCommandTimedOut(t *testing.T) {
	// What go-redis does when a command's deadline passes while Redis is slow but live.
	// The connection is closed and leaves the pool, though its reply could still have
	// been read. The gateway cannot keep it, so the warmer opens another on its own
	// budget (docs/dependencies.md). This test notices if go-redis starts keeping it.
	rd := newLatencyProxy(t, hostOf(t, redisURL(t)))
	client, _, err := conns.NewRedisClient(conns.RedisSingle, withHost(t, redisURL(t), rd.Addr()), "", time.Second, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx := context.Background()
	if err := client.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	rd.SetDelay(200 * time.Millisecond)
	late, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := client.Ping(late).Err(); err == nil {
		t.Fatal("a PING answered in 200ms met a 50ms deadline")
	}
	if s := client.PoolStats(); s.TotalConns != 0 {
		t.Errorf("pool after a timed-out command: %+v; want its one connection thrown away", s)
	}
}

func TestAColdGatewayBehindASlowPostgresAnswersNo503OnceWarm(t *testing.T) {
	// PostgreSQL answers every reply 800ms late, 40% of database_timeout, from before
	// the gateway starts. After 3 s of warm-up under six clients in a closed loop, 10 s
	// more of the same answer no 503. Every batch of lookups finds a warm connection.
	// None opens one on its requests' time: a startup and a preparation, three round
	// trips, more than the timeout. Three cold starts in a row, each on a pool of its
	// own. The delay dwarfs what a loaded machine adds to a lookup. So the waits stay
	// well inside the timeout: a lane's batch, or a tenth of the timeout waiting for
	// one, plus one round trip.
	const (
		delay   = 800 * time.Millisecond
		clients = 6
		warmUp  = 3 * time.Second
		run     = 10 * time.Second
	)
	for i := range 3 {
		t.Run(fmt.Sprintf("cold start %d", i+1), func(t *testing.T) {
			d, key, _ := newDBWithKey(t)
			gw, _, _ := slowGateway(t, d, "", delay, 0, map[string]any{"database_timeout": "2s"})
			closedLoop(t, gw, key, clients, warmUp)
			got := closedLoop(t, gw, key, clients, run)
			t.Logf("after %v of warm-up, %v: statuses %v", warmUp, run, got)
			if got[http.StatusServiceUnavailable] > 0 || got[http.StatusOK] < clients {
				t.Errorf("statuses %v; want only 200s, and some", got)
			}
		})
	}
}

// closedLoop sends GET /v1/me with key from clients concurrent clients, for d, and
// counts the statuses. Each client sends its next request when its last is answered.
func closedLoop(t *testing.T, gw *gateway, key string, clients int, d time.Duration) map[int]int {
	t.Helper()
	var mu sync.Mutex
	got := map[int]int{}
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				res, _ := gw.get(t, "/v1/me", key)
				mu.Lock()
				got[res.StatusCode]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return got
}
