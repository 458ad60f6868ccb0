package caddymodule

import (
	"errors"
	"sync"
	"time"
)

// errBreakerOpen is what a call refused by an open breaker fails with.
var errBreakerOpen = errors.New("circuit breaker open: not waiting on a dependency that keeps failing")

// Defaults of the breakers.
const (
	breakerThreshold = 5           // consecutive failures that open a breaker
	breakerCooldown  = time.Second // how long it stays open before it lets a probe through
)

// breakerState is where a breaker stands.
type breakerState uint8

const (
	breakerClosed   breakerState = iota // calls go through
	breakerOpen                         // calls fail at once
	breakerHalfOpen                     // the probe runs; calls fail at once
)

func (s breakerState) String() string {
	return [...]string{"closed", "open", "half-open"}[s]
}

// callResult is what became of a call a breaker let through.
type callResult uint8

const (
	callSucceeded callResult = iota // the dependency answered
	callFailed                      // the dependency failed or was too slow
	callIgnored                     // neither: the client went away first
)

// breaker is a circuit breaker for one dependency of one gateway instance. After
// threshold failures in a row it opens. Failures less than spacing apart count as
// one. A batch or pipeline round that times out fails all its calls within a tenth
// of the timeout, since a round goes out at most that long after its first call
// joined (keystore.Batcher, limiter). So one slow round counts as one failure, or
// two, however many calls it carried, and never opens the breaker by itself. A
// dependency that hangs under load fails calls all the time, and opens it
// (threshold-1) spacings after the first timeout (docs/operations.md, Circuit
// breakers). Calls then fail at once with errBreakerOpen,
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
type breaker struct {
	threshold int
	cooldown  time.Duration
	spacing   time.Duration // failures closer together count as one; 0: each counts
	now       func() time.Time
	onChange  func(from, to breakerState) // called with mu held: must not call back
	// probe asks the dependency whether it answers again, on a budget of its own, and
	// reports whether it did. It runs on a goroutine of its own, never with mu held.
	// Nil answers yes at once.
	probe func() bool

	mu       sync.Mutex
	state    breakerState // guarded by mu
	failures int          // consecutive failures while closed; guarded by mu
	failedAt time.Time    // when the last failure counted in failures came; guarded by mu
	openedAt time.Time    // guarded by mu
}

// breakerSpacing is the spacing of a breaker whose calls time out after timeout: a
// tenth of it, the longest a round waits for more calls before it goes out.
func breakerSpacing(timeout time.Duration) time.Duration { return timeout / 10 }

func newBreaker(probe func() bool, onChange func(from, to breakerState)) *breaker {
	if onChange == nil {
		onChange = func(breakerState, breakerState) {}
	}
	return &breaker{threshold: breakerThreshold, cooldown: breakerCooldown, now: time.Now, onChange: onChange, probe: probe}
}

// allow reports whether a call may go to the dependency. A call allowed must be
// followed by exactly one done. A call refused after the cooldown starts the probe.
func (b *breaker) allow() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch b.state {
	case breakerClosed:
		return true
	case breakerOpen:
		if b.now().Sub(b.openedAt) >= b.cooldown {
			b.set(breakerHalfOpen)
			go b.runProbe()
		}
	}
	return false
}

// runProbe runs the probe and closes or reopens the breaker by its answer.
func (b *breaker) runProbe() {
	ok := b.probe == nil || b.probe()
	b.mu.Lock()
	defer b.mu.Unlock()
	if ok {
		b.failures = 0
		b.set(breakerClosed)
		return
	}
	b.openedAt = b.now()
	b.set(breakerOpen)
}

// done records the outcome of a call allow let through.
func (b *breaker) done(o callResult) {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.state != breakerClosed:
		// A call from before the breaker opened: the probe decides.
	case o == callSucceeded:
		b.failures = 0
	case o == callFailed:
		now := b.now()
		if b.failures > 0 && now.Sub(b.failedAt) < b.spacing {
			return // the same round's failure, most likely: no new evidence
		}
		b.failedAt = now
		b.failures++
		if b.failures >= b.threshold {
			b.openedAt = now
			b.set(breakerOpen)
		}
	}
}

// closed reports whether calls go through.
func (b *breaker) closed() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == breakerClosed
}

// set moves to state s. It must be called with mu held.
func (b *breaker) set(s breakerState) {
	if b.state != s {
		from := b.state
		b.state = s
		b.onChange(from, s)
	}
}
