package caddymodule

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
)

// TestBatchLingerGathersBusyTrafficAndStaysExact: with batch_linger, 16 clients
// sending back to back share their lookups. Each sends its next request when it has
// its answer. A batch waits until they pause, that is until all of them wait. Every
// key's limit still lets exactly its number through, each counted.
func TestBatchLingerGathersBusyTrafficAndStaysExact(t *testing.T) {
	d := newDB(t)
	d.plan("six", 6)
	up := newUpstream(t)
	const clients, each = 16, 10
	var unlingered float64 // the batches of the run without a linger
	for _, linger := range []string{"", "200ms"} {
		t.Run("batch_linger="+linger, func(t *testing.T) {
			opts := map[string]any{"redis_url": redisURL(t), "redis_timeout": "2s"}
			if linger != "" {
				opts["batch_linger"] = linger
			}
			gw := startGateway(t, gatewayConfig{metrics: true, handler: gatewayOptions(d.url, opts), upstream: up.addr()})
			// sendAll has each client send each requests, back to back, with a key of its own
			// on plan. It counts the statuses.
			sendAll := func(plan string) (byStatus map[int]int, uncounted int) {
				var mu sync.Mutex
				byStatus = map[int]int{}
				var wg sync.WaitGroup
				for range clients {
					key, _ := d.key(d.org(plan), keystore.RoleEditor)
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range each {
							res, _ := gw.get(t, "/v1/me", key)
							mu.Lock()
							byStatus[res.StatusCode]++
							if res.StatusCode == http.StatusOK && res.Header.Get("Ratelimit") == "" {
								uncounted++
							}
							mu.Unlock()
						}
					}()
				}
				wg.Wait()
				return byStatus, uncounted
			}
			sendAll("pro") // the rate batch_linger goes by
			awayFromWindowEdge(t, 15*time.Second)
			before := gw.scrape(t)
			byStatus, uncounted := sendAll("six")
			after := gw.scrape(t)
			if byStatus[http.StatusOK] != 6*clients || byStatus[http.StatusTooManyRequests] != (each-6)*clients || uncounted != 0 {
				t.Errorf("statuses %v, %d let through uncounted; want %d 200s and %d 429s, all counted",
					byStatus, uncounted, 6*clients, (each-6)*clients)
			}
			batches := after[`keygate_key_lookup_batch_size_count`] - before[`keygate_key_lookup_batch_size_count`]
			lookups := after[`keygate_key_lookup_batch_size_sum`] - before[`keygate_key_lookup_batch_size_sum`]
			t.Logf("%v lookups in %v batches: %.1f a batch", lookups, batches, lookups/batches)
			// Ten batches of all 16 at best. Without a linger they go three or four at a time:
			// fifty batches on an idle machine. A client that the scheduler holds back past the
			// pause splits a batch. On two cores shared with the other packages' tests, that
			// happens a few times a run: hence twice the best.
			if linger == "" {
				unlingered = batches
			} else if batches > 2*each || batches > unlingered/2 {
				t.Errorf("%v lookups went in %v batches (%v without a linger); want the batches to wait for all clients (at most %d, and half as many as without)",
					lookups, batches, unlingered, 2*each)
			}
		})
	}
}
