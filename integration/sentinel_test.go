package integration

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// sentinelSet is a Redis primary, its replica and three Sentinels of this test's own
// (scripts/stack.sh up-sentinel on a folder of its own): its primary can be killed once,
// and the stack's shared Sentinel set, whose primary caddymodule's test kills, is left
// alone.
type sentinelSet struct {
	url     string                 // redis_url for redis_mode sentinel
	pidfile string                 // the primary's
	opts    *redis.FailoverOptions // url's, for the test's own clients
}

// startSentinelSet starts a Sentinel set and stops it when the test ends.
func startSentinelSet(t *testing.T) sentinelSet {
	t.Helper()
	dir, err := os.MkdirTemp("", "keygate-sentinel-")
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(root(t), "scripts", "stack.sh")
	t.Cleanup(func() {
		if out, err := exec.Command(script, "down", dir).CombinedOutput(); err != nil {
			t.Errorf("stack.sh down %s: %v\n%s", dir, err, out)
		}
	})
	if out, err := exec.Command(script, "up-sentinel", dir).CombinedOutput(); err != nil {
		t.Fatalf("stack.sh up-sentinel: %v\n%s", err, out)
	}
	env := testenv.StackEnv(t, filepath.Join(dir, "env"))
	set := sentinelSet{url: env["REDIS_SENTINEL_URL"], pidfile: env["REDIS_SENTINEL_PRIMARY_PIDFILE"]}
	if set.url == "" || set.pidfile == "" {
		t.Fatalf("stack.sh up-sentinel wrote %v", env)
	}
	if set.opts, err = redis.ParseFailoverURL(set.url); err != nil {
		t.Fatal(err)
	}
	return set
}

// waitReady waits until every Sentinel knows the replica, with its link to the primary
// up, and the two other Sentinels: before that, a killed primary would not be replaced.
func (set sentinelSet) waitReady(t *testing.T) {
	t.Helper()
	opts := set.opts
	ctx := context.Background()
	testenv.Eventually(t, 20*time.Second, "the Sentinels know the replica and each other", func() bool {
		for _, addr := range opts.SentinelAddrs {
			sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
			m, err := sc.Master(ctx, opts.MasterName).Result()
			replicas, rerr := sc.Replicas(ctx, opts.MasterName).Result()
			sc.Close()
			if err != nil || rerr != nil || m["num-other-sentinels"] != "2" || len(replicas) != 1 ||
				replicas[0]["flags"] != "slave" || replicas[0]["master-link-status"] != "ok" {
				return false
			}
		}
		return true
	})
}

// killPrimary waits until the replica holds every write made so far, then kills the
// primary with SIGKILL.
func (set sentinelSet) killPrimary(t *testing.T) {
	t.Helper()
	c := redis.NewFailoverClient(set.opts)
	defer c.Close()
	if n, err := c.Do(context.Background(), "WAIT", 1, 2000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d replicas, %v", n, err)
	}
	b, err := os.ReadFile(set.pidfile)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	os.Remove(set.pidfile) // so that stack.sh down never signals a reused pid
}

// TestGatewaysOnSentinelKeepCountingThroughAFailover runs the two gateways
// (limiter_failure open and closed) on a Sentinel set of the test's own and kills its
// primary. While no replica is promoted each request is a limiter failure, per
// limiter_failure (open: through without RateLimit headers; closed: 503
// service_unavailable); from each gateway's first count after the failover on, every
// request counts again, in the same window as before, and the key gets exactly its
// limit.
func TestGatewaysOnSentinelKeepCountingThroughAFailover(t *testing.T) {
	set := startSentinelSet(t)
	s := newStackOn(t, set.url, "sentinel")
	const n = 30
	s.cli("", "plan", "put", "--name", "sentinel", "--api-rate-limit", strconv.Itoa(n), "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	_, key := s.newKey("sentinel", "Viewer")
	set.waitReady(t)
	waitForWindowRoom(20) // the failover takes seconds; the budget must not reset meanwhile

	// left is the sequence of RateLimit r= values of the counted answers, in order.
	var left []int
	counted := func(r Resp) bool {
		m := rateLimitRE.FindStringSubmatch(r.Header.Get("RateLimit"))
		if m == nil {
			return false
		}
		v, _ := strconv.Atoi(m[1])
		left = append(left, v)
		return true
	}
	for i := range 4 {
		if r := s.api(key, i%2).do("GET", "/v1/me", nil); r.Status != 200 || !counted(r) {
			t.Fatalf("before the failover, gateway %d: %d %s RateLimit %q", i%2, r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}

	set.killPrimary(t)
	killed := time.Now()
	failures := [2]int{}
	back := [2]time.Duration{}
	for back[0] == 0 || back[1] == 0 {
		if time.Since(killed) > 15*time.Second {
			t.Fatalf("not counting again 15s after the primary was killed (counting after %v; failures %v)", back, failures)
		}
		for i := range 2 {
			r := s.api(key, i).do("GET", "/v1/me", nil)
			switch {
			case r.Status == 200 && counted(r):
				if back[i] == 0 {
					back[i] = time.Since(killed)
				}
			case back[i] != 0:
				t.Fatalf("gateway %d failed again after counting again: %d %s", i, r.Status, r.Body)
			case i == 0 && r.Status == 200 && r.Header.Get("RateLimit-Policy") == "":
				failures[i]++ // limiter_failure open: through, uncounted
			case i == 1 && r.Status == http.StatusServiceUnavailable:
				wantError(t, r, 503, serviceUnavailable)
				failures[i]++
			default:
				t.Fatalf("gateway %d during the failover: %d %s RateLimit %q", i, r.Status, r.Body, r.Header.Get("RateLimit"))
			}
		}
		// Paced on purpose, not an event: from a gateway's first count on, each round spends
		// the key's budget until the other gateway counts too.
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("limiter failures during the failover: %v requests; counting again after %v (open) and %v (closed)",
		failures, back[0].Round(time.Millisecond), back[1].Round(time.Millisecond))
	for i, f := range failures {
		if f == 0 {
			t.Errorf("gateway %d saw no limiter failure: the primary's death went unnoticed", i)
		}
	}

	// The rest of the budget, then 429: the count went on where it was.
	for i := 0; len(left) < n; i++ {
		if r := s.api(key, i%2).do("GET", "/v1/me", nil); r.Status != 200 || !counted(r) {
			t.Fatalf("after the failover, request %d on gateway %d: %d %s RateLimit %q", len(left)+1, i%2, r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}
	for i := range 2 {
		r := s.api(key, i).do("GET", "/v1/me", nil)
		if r.Status != http.StatusTooManyRequests || !strings.HasPrefix(r.Header.Get("RateLimit"), `"default";r=0;`) {
			t.Errorf("request %d of %d on gateway %d: %d %s RateLimit %q; want 429", n+1+i, n, i, r.Status, r.Body, r.Header.Get("RateLimit"))
		}
	}
	for i, v := range left {
		if v != n-1-i {
			t.Fatalf("RateLimit r= of the counted answers %v: answer %d left %d, want %d (a count lost or doubled)", left, i+1, v, n-1-i)
		}
	}
}
