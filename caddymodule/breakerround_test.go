package caddymodule

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestOneSlowRoundOfLookupsDoesNotOpenTheBreaker: PostgreSQL hangs for one round of
// 40 concurrent lookups, which all answer 503 after database_timeout. Then it answers
// again, and so does the gateway, at once: the breaker did not open on that one round.
func TestOneSlowRoundOfLookupsDoesNotOpenTheBreaker(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	pg := newLatencyProxy(t, hostOf(t, d.url))
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, pg.Addr()), map[string]any{"database_timeout": "1s"}),
		upstream: newUpstream(t).addr(),
	})
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("before the hang: %d %s", res.StatusCode, body)
	}
	pg.Hang()
	got, _ := statuses(t, gw, 40, "/v1/me", key)
	pg.Resume()
	if got[http.StatusServiceUnavailable] != 40 {
		t.Fatalf("statuses of the slow round %v, want 40 503s", got)
	}
	res, body := gw.get(t, "/v1/me", key)
	if res.StatusCode != http.StatusOK {
		t.Errorf("after the slow round: %d %s, want 200: the breaker opened", res.StatusCode, body)
	}
	if log := gw.logText(t); strings.Contains(log, "circuit breaker open") {
		t.Errorf("the breaker opened on one slow round:\n%s", log)
	}
}

// TestAHungPostgresUnderLoadOpensTheBreakerWithinATimeoutAndAHalf: requests arrive
// every 10 ms when PostgreSQL hangs. The first fail after database_timeout (1s); the
// breaker opens a spacing (0.2s) later, and from then on 503s come at once.
func TestAHungPostgresUnderLoadOpensTheBreakerWithinATimeoutAndAHalf(t *testing.T) {
	d, key, _ := newDBWithKey(t)
	pg := newLatencyProxy(t, hostOf(t, d.url))
	gw := startGateway(t, gatewayConfig{
		handler:  gatewayOptions(withHost(t, d.url, pg.Addr()), map[string]any{"database_timeout": "1s"}),
		upstream: newUpstream(t).addr(),
	})
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("before the hang: %d %s", res.StatusCode, body)
	}
	pg.Hang()
	hung := time.Now()
	opened := make(chan time.Duration, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(5 * time.Second)
loop:
	for {
		select {
		case <-tick.C:
		case <-opened:
			break loop
		case <-deadline:
			t.Error("no 503 came at once within 5s of the hang: the breaker never opened")
			break loop
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			res, body := gw.get(t, "/v1/me", key)
			if res.StatusCode != http.StatusServiceUnavailable {
				t.Errorf("during the hang: %d %s, want 503", res.StatusCode, body)
			}
			if time.Since(start) < 100*time.Millisecond {
				select {
				case opened <- start.Sub(hung):
				default:
				}
			}
		}()
	}
	close(stop)
	wg.Wait()
	pg.Resume()
	select {
	case at := <-opened:
		if at > 2500*time.Millisecond {
			t.Errorf("the breaker opened %v after the hang; want within about a timeout and a half (1.4s)", at)
		}
		t.Logf("the breaker opened %v after the hang", at)
	default:
	}
}
