package conns

import (
	"errors"
	"sync"
	"time"
)

// ErrBreakerOpen is what a call refused by an open breaker fails with.
var ErrBreakerOpen = errors.New("circuit breaker open: not waiting on a dependency that keeps failing")

// Defaults of the breakers.
const (
	BreakerThreshold = 5           // consecutive failures that open a breaker
	BreakerCooldown  = time.Second // how long it stays open before it lets a probe through
)

// BreakerState is where a breaker stands.
type BreakerState uint8

const (
	BreakerClosed   BreakerState = iota // calls go through
	BreakerOpen                         // calls fail at once
	BreakerHalfOpen                     // the probe runs; calls fail at once
)

func (s BreakerState) String() string {
	return [...]string{"closed", "open", "half-open"}[s]
}

// CallResult is what became of a call a breaker let through.
type CallResult uint8

const (
	CallSucceeded CallResult = iota // the dependency answered
	CallFailed                      // the dependency failed or was too slow
	CallIgnored                     // neither: the client went away first
)

// Breaker is a circuit breaker for one dependency of one gateway instance. It opens
// after threshold failures in a row that span at least Spacing: more than one
// moment. A batch or pipeline round that times out fails all its calls within a
// tenth of the timeout, since a round goes out at most that long after its first call
// joined (keystore.Batcher, limiter), and Spacing is twice that (BreakerSpacing). So
// one slow round, however many calls it carried, never opens the breaker by itself. A dependency that hangs fails the next
// round too: under steady load a spacing after the first timeout, under a client's
// lock-step load (each waits for its answer, then asks again) one timeout after it
// (docs/operations.md, Circuit breakers). Calls then fail at once with ErrBreakerOpen,
// instead of each waiting out a timeout on a dependency that hangs. After cooldown it
// starts one probe in the background, and only one at a time. Calls go on failing
// at once meanwhile. An answer closes the breaker; a failure opens it for another
// cooldown.
//
// The probe is not a request's call. It runs on the dependency's own budget:
// dial_timeout plus the request timeout. So a dependency slow to connect to, after a
// restart behind a slow link say, can still close the breaker. No request ever
// waits on a probe.
//
// It is a few dozen lines rather than sony/gobreaker, because it needs no more:
// consecutive failures, one probe, a state-change hook for logs and metrics. Every
// line of it is tested here. A dependency would bring a go.mod change, and a
// counting model (windows of requests, ratios) the gateway does not use.
type Breaker struct {
	threshold int
	cooldown  time.Duration
	Spacing   time.Duration // the least span of a run of failures that opens it; 0: any
	now       func() time.Time
	onChange  func(from, to BreakerState) // called with mu held: must not call back
	// probe asks the dependency whether it answers again, on a budget of its own, and
	// reports whether it did. It runs on a goroutine of its own, never with mu held.
	// Nil answers yes at once.
	probe func() bool

	mu       sync.Mutex
	state    BreakerState // guarded by mu
	failures int          // consecutive failures while closed; guarded by mu
	failedAt time.Time    // when the first of those failures came; guarded by mu
	openedAt time.Time    // guarded by mu
}

// BreakerSpacing is the spacing of a breaker whose calls time out after timeout: a
// fifth of it. A round waits at most a tenth of it for more calls before it goes out,
// so its calls' deadlines, each its own, lie within a tenth of each other; twice that
// leaves room for timers that fire late on a busy machine.
func BreakerSpacing(timeout time.Duration) time.Duration { return timeout / 5 }

// NewBreaker returns a closed breaker with the default threshold and cooldown, and no
// Spacing. probe is as the Breaker's field of that name. onChange, when not nil, hears
// every change of state, with the breaker's lock held.
func NewBreaker(probe func() bool, onChange func(from, to BreakerState)) *Breaker {
	if onChange == nil {
		onChange = func(BreakerState, BreakerState) {}
	}
	return &Breaker{threshold: BreakerThreshold, cooldown: BreakerCooldown, now: time.Now, onChange: onChange, probe: probe}
}

// Allow reports whether a call may go to the dependency. A call allowed must be
// followed by exactly one Done. A call refused after the cooldown starts the probe.
func (b *Breaker) Allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerOpen:
		if b.now().Sub(b.openedAt) >= b.cooldown {
			b.set(BreakerHalfOpen)
			go b.runProbe()
		}
	}
	return false
}

// runProbe runs the probe and closes or reopens the breaker by its answer.
func (b *Breaker) runProbe() {
	ok := b.probe == nil || b.probe()
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.failures = 0
		b.set(BreakerClosed)
		return
	}
	b.openedAt = b.now()
	b.set(BreakerOpen)
}

// Done records the outcome of a call Allow let through.
func (b *Breaker) Done(o CallResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.state != BreakerClosed:
		// A call from before the breaker opened: the probe decides.
	case o == CallSucceeded:
		b.failures = 0
	case o == CallFailed:
		now := b.now()
		if b.failures == 0 {
			b.failedAt = now
		}
		b.failures++
		// Failures all within a spacing of the first are one round's, most likely:
		// not yet evidence that the dependency hangs.
		if b.failures >= b.threshold && now.Sub(b.failedAt) >= b.Spacing {
			b.openedAt = now
			b.set(BreakerOpen)
		}
	}
}

// Closed reports whether calls go through.
func (b *Breaker) Closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == BreakerClosed
}

// set moves to state s. It must be called with mu held.
func (b *Breaker) set(s BreakerState) {
	if b.state != s {
		from := b.state
		b.state = s
		b.onChange(from, s)
	}
}
