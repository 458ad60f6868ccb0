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
	// Ping asks the dependency once whether it answers, on a budget of its own, for
	// Check: a probe without the probe's retries. Nil: the probe. Set it before the
	// first call.
	Ping func() bool
	// OnUp, when not nil, hears the dependency found up or down (Up), with mu held: it
	// must not call back. Set it before the first call.
	OnUp func(up bool)

	mu           sync.Mutex
	state        BreakerState // guarded by mu
	failures     int          // consecutive failures while closed; guarded by mu
	failedAt     time.Time    // when the first of those failures came; guarded by mu
	openedAt     time.Time    // guarded by mu
	up           upState      // guarded by mu
	calls        uint64       // calls done, whatever they came to; guarded by mu
	checkedAt    time.Time    // Check's last look at an idle dependency; guarded by mu
	checkedCalls uint64       // calls at that look; guarded by mu
	pinging      bool         // a Ping runs; guarded by mu
	watched      *watchedDep  // where Up is reported for the process (Watch); guarded by mu
}

// upState is what a breaker last heard of its dependency: from a call, its probe or a
// ping.
type upState int32

const (
	upUnknown upState = iota // nothing yet
	upYes                    // it answered
	upNo                     // it failed
)

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
		b.probeIfDue(b.now())
	}
	return false
}

// probeIfDue starts the probe of an open breaker whose cooldown is over at now. It
// must be called with mu held.
func (b *Breaker) probeIfDue(now time.Time) {
	if b.state == BreakerOpen && now.Sub(b.openedAt) >= b.cooldown {
		b.set(BreakerHalfOpen)
		go b.runProbe()
	}
}

// runProbe runs the probe and closes or reopens the breaker by its answer.
func (b *Breaker) runProbe() {
	ok := b.probe == nil || b.probe()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.setUp(ok)
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
		b.calls++
		b.failures = 0
		b.setUp(true)
	case o == CallFailed:
		b.calls++
		b.setUp(false)
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

// Up reports whether the dependency answers, as far as b knows: b is closed, and the
// last call, probe or ping it heard of was answered. It is false while b knows
// nothing yet.
func (b *Breaker) Up() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.state == BreakerClosed && b.up == upYes
}

// Check reports Up, and has b learn more in the background where it is due, so that
// a gateway without traffic still knows its dependencies (keygate_health). An open
// breaker past its cooldown starts its probe, as a refused call would. A closed one
// pings its dependency (Ping) when it knows nothing yet, or when no call was done
// since its look at least every ago. Nothing waits on either.
func (b *Breaker) Check(every time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.now()
	b.probeIfDue(now)
	if b.state == BreakerClosed && !b.pinging && (b.up == upUnknown || now.Sub(b.checkedAt) >= every) {
		if b.up == upUnknown || b.calls == b.checkedCalls {
			b.pinging = true
			go b.runPing(b.calls)
		}
		b.checkedAt, b.checkedCalls = now, b.calls
	}
	return b.state == BreakerClosed && b.up == upYes
}

// runPing pings the dependency and records its answer, unless a call done
// meanwhile, of which there were calls before, told b something newer.
func (b *Breaker) runPing(calls uint64) {
	ping := b.Ping
	if ping == nil {
		ping = b.probe
	}
	ok := ping == nil || ping()
	b.mu.Lock()
	defer b.mu.Unlock()
	b.pinging = false
	if b.state == BreakerClosed && b.calls == calls {
		b.setUp(ok)
	}
}

// setUp records what b heard of its dependency: OnUp and the process's view (Watch)
// hear of a change. It must be called with mu held.
func (b *Breaker) setUp(up bool) {
	s := upNo
	if up {
		s = upYes
	}
	if b.up == s {
		return
	}
	b.up = s
	if b.watched != nil {
		b.watched.last.Store(int32(s))
	}
	if b.OnUp != nil {
		b.OnUp(up)
	}
}

// set moves to state s. It must be called with mu held.
func (b *Breaker) set(s BreakerState) {
	if b.state != s {
		from := b.state
		b.state = s
		b.onChange(from, s)
	}
}
