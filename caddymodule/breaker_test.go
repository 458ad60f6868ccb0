package caddymodule

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func newTestBreaker() (*breaker, *time.Time, *[]string) {
	now := time.Unix(1_000_000, 0)
	var changes []string
	b := newBreaker(func(from, to breakerState) { changes = append(changes, from.String()+"→"+to.String()) })
	b.now = func() time.Time { return now }
	return b, &now, &changes
}

// call lets one call through b if it may, with outcome o, and reports whether it went.
func call(b *breaker, o callResult) bool {
	ok, probe := b.allow()
	if ok {
		b.done(probe, o)
	}
	return ok
}

func TestBreakerOpensAfterThresholdFailuresInARow(t *testing.T) {
	b, _, changes := newTestBreaker()
	for i := range breakerThreshold - 1 {
		if !call(b, callFailed) {
			t.Fatalf("call %d refused before the threshold", i+1)
		}
	}
	call(b, callSucceeded) // a success starts the count again
	for range breakerThreshold - 1 {
		call(b, callFailed)
	}
	if !b.closed() {
		t.Fatal("opened without threshold failures in a row")
	}
	call(b, callFailed)
	if b.closed() || call(b, callSucceeded) {
		t.Fatal("still lets calls through after threshold failures in a row")
	}
	if len(*changes) != 1 || (*changes)[0] != "closed→open" {
		t.Errorf("changes %v", *changes)
	}
}

func TestBreakerLetsOneProbeThroughAfterTheCooldown(t *testing.T) {
	for _, tc := range []struct {
		name       string
		probe      callResult
		wantClosed bool
		wantNext   bool // whether the next call goes through at once
	}{
		{"an answer closes it", callSucceeded, true, true},
		{"a failure opens it for another cooldown", callFailed, false, false},
		{"a probe whose client left hands over to the next call", callIgnored, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, now, _ := newTestBreaker()
			for range breakerThreshold {
				call(b, callFailed)
			}
			*now = now.Add(breakerCooldown - time.Millisecond)
			if ok, _ := b.allow(); ok {
				t.Fatal("a call went through before the cooldown ended")
			}
			*now = now.Add(time.Millisecond)
			ok, probe := b.allow()
			if !ok || !probe {
				t.Fatalf("after the cooldown: ok %v probe %v, want a probe", ok, probe)
			}
			if ok2, _ := b.allow(); ok2 {
				t.Fatal("a second call went through while the probe was out")
			}
			b.done(true, tc.probe)
			if b.closed() != tc.wantClosed {
				t.Errorf("closed = %v, want %v", b.closed(), tc.wantClosed)
			}
			if ok, _ := b.allow(); ok != tc.wantNext {
				t.Errorf("next call went through = %v, want %v", ok, tc.wantNext)
			}
		})
	}
}

func TestBreakerIgnoresLateCallsOnceOpen(t *testing.T) {
	b, _, _ := newTestBreaker()
	ok, probe := b.allow() // a call in flight when the breaker opens
	for range breakerThreshold {
		call(b, callFailed)
	}
	b.done(probe, callSucceeded)
	if !ok || b.closed() {
		t.Error("a late answer from before the breaker opened closed it; only a probe may")
	}
}

func TestBreakerOneProbeAtATimeUnderConcurrency(t *testing.T) {
	b, now, _ := newTestBreaker()
	for range breakerThreshold {
		call(b, callFailed)
	}
	*now = now.Add(breakerCooldown)
	var through atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, _ := b.allow(); ok {
				through.Add(1)
			}
		}()
	}
	wg.Wait()
	if through.Load() != 1 {
		t.Errorf("%d calls went through a half-open breaker, want 1", through.Load())
	}
}
