package conns

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// testBreaker is a breaker on a clock the test moves. Its probe waits for the test's
// answer on answers, and counts how often it ran.
type testBreaker struct {
	*Breaker
	now       *time.Time
	changes   *[]string
	answers   chan bool
	probes    atomic.Int64
	changesMu sync.Mutex // guards changes, which onChange writes from the probe's goroutine
}

func newTestBreaker() *testBreaker {
	now := time.Unix(1_000_000, 0)
	tb := &testBreaker{now: &now, changes: new([]string), answers: make(chan bool)}
	tb.Breaker = NewBreaker(func() bool {
		tb.probes.Add(1)
		return <-tb.answers
	}, func(from, to BreakerState) {
		tb.changesMu.Lock()
		defer tb.changesMu.Unlock()
		*tb.changes = append(*tb.changes, from.String()+"→"+to.String())
	})
	tb.Breaker.now = func() time.Time { return now }
	return tb
}

// call lets one call through b if it may, with outcome o, and reports whether it went.
func call(b *testBreaker, o CallResult) bool {
	ok := b.Allow()
	if ok {
		b.Done(o)
	}
	return ok
}

// settled waits until the probe's answer has been applied: the breaker is no longer
// half-open.
func (b *testBreaker) settled(t *testing.T) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, "the probe's answer applied", func() bool {
		b.Breaker.mu.Lock()
		defer b.Breaker.mu.Unlock()
		return b.state != BreakerHalfOpen
	})
}

func TestBreakerOpensAfterThresholdFailuresInARow(t *testing.T) {
	b := newTestBreaker()
	for i := range BreakerThreshold - 1 {
		if !call(b, CallFailed) {
			t.Fatalf("call %d refused before the threshold", i+1)
		}
	}
	call(b, CallSucceeded) // a success starts the count again
	for range BreakerThreshold - 1 {
		call(b, CallFailed)
	}
	if !b.Closed() {
		t.Fatal("opened without threshold failures in a row")
	}
	call(b, CallFailed)
	if b.Closed() || call(b, CallSucceeded) {
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
			for range BreakerThreshold {
				call(b, CallFailed)
			}
			*b.now = b.now.Add(BreakerCooldown - time.Millisecond)
			if b.Allow() {
				t.Fatal("a call went through before the cooldown ended")
			}
			*b.now = b.now.Add(time.Millisecond)
			// The call that finds the cooldown over starts the probe, and is refused itself. No
			// request waits on a probe.
			if b.Allow() {
				t.Fatal("the call after the cooldown went through; the probe is not a request's")
			}
			if b.Allow() {
				t.Fatal("a call went through while the probe was out")
			}
			b.answers <- tc.answer
			b.settled(t)
			if b.Closed() != tc.wantClosed {
				t.Errorf("closed = %v, want %v", b.Closed(), tc.wantClosed)
			}
			if got := b.Allow(); got != tc.wantClosed {
				t.Errorf("next call went through = %v, want %v", got, tc.wantClosed)
			}
			if !tc.wantClosed {
				// Reopened now: the next probe waits for another cooldown.
				*b.now = b.now.Add(BreakerCooldown)
				b.Allow()
				b.answers <- true
				b.settled(t)
				if !b.Closed() || b.probes.Load() != 2 {
					t.Errorf("after another cooldown: closed %v after %d probes, want closed after 2", b.Closed(), b.probes.Load())
				}
			}
		})
	}
}

func TestBreakerIgnoresLateCallsOnceOpen(t *testing.T) {
	b := newTestBreaker()
	ok := b.Allow() // a call in flight when the breaker opens
	for range BreakerThreshold {
		call(b, CallFailed)
	}
	b.Done(CallSucceeded)
	if !ok || b.Closed() {
		t.Error("a late answer from before the breaker opened closed it; only a probe may")
	}
}

func TestBreakerOneProbeAtATimeUnderConcurrency(t *testing.T) {
	b := newTestBreaker()
	for range BreakerThreshold {
		call(b, CallFailed)
	}
	*b.now = b.now.Add(BreakerCooldown)
	var through atomic.Int64
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			if b.Allow() {
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
