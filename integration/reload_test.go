package integration

// `caddy reload` under load: a changed v1_gateway config loaded through bin/caddy's
// admin API while clients send.

import (
	"context"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// reloadGateway loads gateway i's Caddyfile again with options as its v1_gateway's
// extra lines, through `caddy reload` and the gateway's admin API.
func (s *Stack) reloadGateway(i int, options string) {
	s.t.Helper()
	g := s.gateways[i]
	if err := os.WriteFile(g.config, s.caddyfile(g, options), 0o600); err != nil {
		s.t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(s.bin, "caddy"), "reload", "--config", g.config, "--adapter", "caddyfile",
		"--address", g.adminAt)
	cmd.Env = append(os.Environ(), "HOME="+filepath.Dir(g.config))
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("caddy reload of gateway %d: %v\n%s", i, err, out)
	}
}

// getThroughAReload sends GET url with key and returns the status. A request whose
// new connection is reset, or refused, before any answer is sent again, at most
// twice, counted in resets. Caddy listens with SO_REUSEPORT, a socket per config: a
// connection the kernel queued on the old config's socket in the instant before it
// closed is reset (docs/operations.md, Reloads and scaling out). That request never
// reached the gateway; the test's exact count and usage record show it.
func getThroughAReload(client *http.Client, url, key string, resets *atomic.Int64) (int, error) {
	for try := 0; ; try++ {
		reused := false // a connection dialed for the request, or not even dialed
		trace := &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { reused = i.Reused }}
		req, err := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), trace), "GET", url, nil)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			return resp.StatusCode, nil
		}
		if reused || try == 2 {
			return 0, err
		}
		resets.Add(1)
	}
}

// TestAReloadUnderLoadFailsNothingAndCountsEverything: clients send through a gateway
// while its config is reloaded again and again, each time with another route table
// and route costs, usage flush interval (which replaces the usage recorder), Redis
// timeout and, where the stack has them, standbys. No request fails or waits past the
// gateway's timeouts. The key's rate-limit count goes on across the reloads: the
// request after the load finds exactly what the load spent gone from its minute. And
// the usage record holds every request answered.
func TestAReloadUnderLoadFailsNothingAndCountsEverything(t *testing.T) {
	s := newStack(t)
	s.cli("", "plan", "put", "--name", "roomy", "--api-rate-limit", "100000", "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	org, owner := s.newOwner("roomy")
	keyID, key := owner.createKey(org.ID, "k", "Admin", nil)
	standbys := ""
	if fast := os.Getenv("DATABASE_STANDBY_FAST_URL"); fast != "" {
		u, err := url.Parse(fast)
		if err != nil {
			t.Fatal(err)
		}
		d, err := url.Parse(s.dbURL)
		if err != nil {
			t.Fatal(err)
		}
		u.Path = d.Path // the test's database, which the standby has too
		standbys = "database_read_urls " + u.String()
	}
	// The load's routes cost 1 in both, so that its count is its number of requests.
	configs := []string{
		"usage_flush_interval 1s\nroute GET /v1/monitors* scope monitors:read\nroute POST /v1/monitors scope monitors:write cost 5\nroute * /v1/* scope monitors:write",
		"usage_flush_interval 2s\nredis_timeout 300ms\n" + standbys + "\nroute GET /v1/monitors* scope monitors:read cost 1\nroute POST /v1/monitors scope monitors:write cost 3\nroute * /v1/* scope monitors:delete",
	}
	s.reloadGateway(0, configs[0])
	// The load and the request after it in one rate-limit window; the reloads take a
	// few seconds at most.
	waitForWindowRoom(40)
	start := time.Now()

	var (
		stop     atomic.Bool
		mu       sync.Mutex
		answers  = map[int]int{}
		slowest  time.Duration
		wg       sync.WaitGroup
		done     [4]atomic.Int64      // each worker's requests answered
		resets   atomic.Int64         // fresh connections reset before any answer
		answered = map[string]int64{} // usage record line → requests
		// Connections kept alive, as an API client keeps them (docs/operations.md,
		// Reloads).
		client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: len(done)}}
	)
	for w := range len(done) {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				path, outcome := "/v1/me", "me"
				if (w+i)%2 == 1 {
					path, outcome = "/v1/monitors", "proxied"
				}
				sent := time.Now()
				status, err := getThroughAReload(client, s.URL(0)+path, key, &resets)
				if err != nil {
					t.Errorf("GET %s: %v", path, err)
				}
				mu.Lock()
				answers[status]++
				slowest = max(slowest, time.Since(sent))
				if status == http.StatusOK {
					answered[keyID+" "+outcome+" 200"]++
				}
				mu.Unlock()
				done[w].Add(1)
			}
		})
	}
	for i := range 6 {
		s.reloadGateway(0, configs[(i+1)%2])
		// Every client gets answers from the new config before the next reload.
		var after [len(done)]int64
		for w := range done {
			after[w] = done[w].Load()
		}
		testenv.Eventually(t, 30*time.Second, "every client answered after reload "+strconv.Itoa(i+1), func() bool {
			for w := range done {
				if done[w].Load() < after[w]+3 {
					return false
				}
			}
			return true
		})
	}
	stop.Store(true)
	wg.Wait()
	if len(answers) != 1 || answers[http.StatusOK] == 0 {
		t.Fatalf("answers by status during the reloads %v, want 200 only", answers)
	}
	// database_timeout (2s) and redis_timeout bound a request; a busy machine adds a
	// little.
	if slowest > 4*time.Second {
		t.Errorf("the slowest request took %v; want it within the gateway's timeouts", slowest)
	}
	t.Logf("%d requests over 6 reloads, the slowest %v; %d sent again on a new connection after the kernel reset theirs",
		answers[http.StatusOK], slowest, resets.Load())

	r := s.api(key, 0).do("GET", "/v1/me", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/me after the reloads: %d %s", r.Status, r.Body)
	}
	answered[keyID+" me 200"]++
	m := rateLimitRE.FindStringSubmatch(r.Header.Get("RateLimit"))
	if want := strconv.Itoa(100000 - answers[http.StatusOK] - 1); m == nil || m[1] != want {
		t.Errorf("RateLimit after %d requests: %q, want remaining %s: the minute's count went on across the reloads",
			answers[http.StatusOK], r.Header.Get("RateLimit"), want)
	}
	want := int64(answers[http.StatusOK] + 1)
	testenv.Eventually(t, 30*time.Second, "as many requests in the usage record as were answered", func() bool {
		var n int64
		for _, c := range owner.usageTotals(org.ID, start) {
			n += c
		}
		return n >= want
	})
	wantTotals(t, "after the reloads", owner.usageTotals(org.ID, start), answered)
}
