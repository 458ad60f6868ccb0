package caddymodule

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// testBreaker is a breaker on a clock the test moves. Its probe waits for the test's
// answer on answers, and counts how often it ran.
type testBreaker struct {
	*breaker
	now       *time.Time
	changes   *[]string
	answers   chan bool
	probes    atomic.Int64
	changesMu sync.Mutex // guards changes, which onChange writes from the probe's goroutine
}

func newTestBreaker() *testBreaker {
	now := time.Unix(1_000_000, 0)
	tb := &testBreaker{now: &now, changes: new([]string), answers: make(chan bool)}
	tb.breaker = newBreaker(func() bool {
		tb.probes.Add(1)
		return <-tb.answers
	}, func(from, to breakerState) {
		tb.changesMu.Lock()
		defer tb.changesMu.Unlock()
		*tb.changes = append(*tb.changes, from.String()+"→"+to.String())
	})
	tb.breaker.now = func() time.Time { return now }
	return tb
}

// call lets one call through b if it may, with outcome o, and reports whether it went.
func call(b *testBreaker, o callResult) bool {
	ok := b.allow()
	if ok {
		b.done(o)
	}
	return ok
}

// settled waits until the probe's answer has been applied: the breaker is no longer
// half-open.
func (b *testBreaker) settled(t *testing.T) {
	t.Helper()
	for range 1000 {
		b.breaker.mu.Lock()
		half := b.state == breakerHalfOpen
		b.breaker.mu.Unlock()
		if !half {
			return
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatal("the probe's answer was never applied")
}

func TestBreakerOpensAfterThresholdFailuresInARow(t *testing.T) {
	b := newTestBreaker()
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
	if len(*b.changes) != 1 || (*b.changes)[0] != "closed→open" {
		t.Errorf("changes %v", *b.changes)
	}
}

func TestBreakerProbesInTheBackgroundAfterTheCooldownWhileCallsFailAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name       string
		answer     bool
		wantClosed bool
	}{
		{"an answer closes it", true, true},
		{"no answer opens it for another cooldown", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newTestBreaker()
			for range breakerThreshold {
				call(b, callFailed)
			}
			*b.now = b.now.Add(breakerCooldown - time.Millisecond)
			if b.allow() {
				t.Fatal("a call went through before the cooldown ended")
			}
			*b.now = b.now.Add(time.Millisecond)
			// The call that finds the cooldown over starts the probe, and is refused itself. No
			// request waits on a probe.
			if b.allow() {
				t.Fatal("the call after the cooldown went through; the probe is not a request's")
			}
			if b.allow() {
				t.Fatal("a call went through while the probe was out")
			}
			b.answers <- tc.answer
			b.settled(t)
			if b.closed() != tc.wantClosed {
				t.Errorf("closed = %v, want %v", b.closed(), tc.wantClosed)
			}
			if got := b.allow(); got != tc.wantClosed {
				t.Errorf("next call went through = %v, want %v", got, tc.wantClosed)
			}
			if !tc.wantClosed {
				// Reopened now: the next probe waits for another cooldown.
				*b.now = b.now.Add(breakerCooldown)
				b.allow()
				b.answers <- true
				b.settled(t)
				if !b.closed() || b.probes.Load() != 2 {
					t.Errorf("after another cooldown: closed %v after %d probes, want closed after 2", b.closed(), b.probes.Load())
				}
			}
		})
	}
}

func TestBreakerIgnoresLateCallsOnceOpen(t *testing.T) {
	b := newTestBreaker()
	ok := b.allow() // a call in flight when the breaker opens
	for range breakerThreshold {
		call(b, callFailed)
	}
	b.done(callSucceeded)
	if !ok || b.closed() {
		t.Error("a late answer from before the breaker opened closed it; only a probe may")
	}
}

func TestBreakerOneProbeAtATimeUnderConcurrency(t *testing.T) {
	b := newTestBreaker()
	for range breakerThreshold {
		call(b, callFailed)
	}
	*b.now = b.now.Add(breakerCooldown)
	var through atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if b.allow() {
				through.Add(1)
			}
		})
	}
	wg.Wait()
	b.answers <- true
	b.settled(t)
	if through.Load() != 0 || b.probes.Load() != 1 {
		t.Errorf("%d calls went through a half-open breaker and %d probes ran, want 0 and 1", through.Load(), b.probes.Load())
	}
}
