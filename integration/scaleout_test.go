package integration

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestGatewaysOnARedisClusterShareOneExactBudget runs the two gateways on the stack's
// 3-master Redis Cluster (redis_mode cluster): keys whose counters live on different
// masters each get exactly their limit across both gateways under concurrency.
func TestGatewaysOnARedisClusterShareOneExactBudget(t *testing.T) {
	clusterURL := os.Getenv("REDIS_CLUSTER_URL")
	if clusterURL == "" {
		t.Fatal("REDIS_CLUSTER_URL is not set: run the tests with `make test` (scripts/stack.sh up-cluster)")
	}
	// Gateway 0 fails open: a count that outlasts redis_timeout lets its request through
	// uncounted. Six Cluster nodes on a busy machine can take longer than the default
	// 200ms, which is not what this test is about: a timeout they never reach.
	s := newStackWith(t, stackOptions{redisURL: clusterURL, redisMode: "cluster", gwOptions: "redis_timeout 5s"})
	const n, nKeys = 10, 6
	s.cli("", "plan", "put", "--name", "tiny", "--api-rate-limit", strconv.Itoa(n), "--max-monitors", "10",
		"--min-interval", "60", "--locations", "us-east", "--check-types", "http")
	org, owner := s.newOwner("tiny")

	opts, err := redis.ParseClusterURL(clusterURL)
	if err != nil {
		t.Fatal(err)
	}
	cc := redis.NewClusterClient(opts)
	defer cc.Close()
	keys := make([]string, nKeys)
	masters := map[string]bool{}
	for i := range keys {
		var id string
		id, keys[i] = owner.createKey(org.ID, fmt.Sprintf("k%d", i), "Viewer", nil)
		node, err := cc.MasterForKey(context.Background(), "{"+id+"}") // the limiter's hash tag
		if err != nil {
			t.Fatal(err)
		}
		masters[node.Options().Addr] = true
	}
	if len(masters) < 2 {
		t.Fatalf("the %d keys' counters live on %d master(s); want several", nKeys, len(masters))
	}

	waitForWindowRoom(15)
	var (
		mu       sync.Mutex
		statuses = make([]map[int]int, nKeys)
		wg       sync.WaitGroup
	)
	for k := range keys {
		statuses[k] = map[int]int{}
		for i := range 3 * n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := s.api(keys[k], i%2).do("GET", "/v1/me", nil)
				mu.Lock()
				defer mu.Unlock()
				statuses[k][r.Status]++
			}()
		}
	}
	wg.Wait()
	for k, st := range statuses {
		if st[200] != n || st[429] != 2*n {
			t.Errorf("key %d: statuses %v, want %d × 200 and %d × 429 across the two gateways", k, st, n, 2*n)
		}
	}
}
