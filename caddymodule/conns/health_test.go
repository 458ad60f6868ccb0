package conns

import (
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// pinged is a testBreaker whose Ping waits for the test's answer on pongs, counts
// how often it ran, and whose OnUp notes what it heard.
type pinged struct {
	*testBreaker
	pongs chan bool
	pings atomic.Int64
	mu    sync.Mutex
	heard []bool // OnUp's calls; guarded by mu
}

func newPinged() *pinged {
	p := &pinged{testBreaker: newTestBreaker(), pongs: make(chan bool)}
	p.Ping = func() bool {
		p.pings.Add(1)
		return <-p.pongs
	}
	p.OnUp = func(up bool) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.heard = append(p.heard, up)
	}
	return p
}

// answer answers the ping under way with up, and waits until the breaker has it.
func (p *pinged) answer(t *testing.T, up bool) {
	t.Helper()
	p.pongs <- up
	testenv.Eventually(t, 10*time.Second, "the ping's answer recorded", func() bool {
		p.Breaker.mu.Lock()
		defer p.Breaker.mu.Unlock()
		return !p.pinging
	})
}

func (p *pinged) onUp() []bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.heard)
}

func TestCheckPingsADependencyNoCallHasUsedAndNotABusyOne(t *testing.T) {
	b := newPinged()
	if b.Check(time.Second) {
		t.Fatal("up before anything was heard")
	}
	b.answer(t, true)
	if !b.Check(time.Second) || b.pings.Load() != 1 {
		t.Fatalf("after a ping answered: up %v after %d pings, want up after 1", b.Up(), b.pings.Load())
	}

	// No call for a second: the next look pings, and a failed ping is down.
	*b.now = b.now.Add(time.Second)
	b.Check(time.Second)
	b.answer(t, false)
	if b.Up() || !b.Closed() {
		t.Fatalf("after a failed ping: up %v closed %v, want down and closed (a ping is no call)", b.Up(), b.Closed())
	}

	// A call answered is up again, and a dependency calls use is not pinged.
	call(b.testBreaker, CallSucceeded)
	for range 3 {
		*b.now = b.now.Add(time.Second)
		call(b.testBreaker, CallSucceeded)
		if !b.Check(time.Second) {
			t.Fatal("down while calls succeed")
		}
	}
	if b.pings.Load() != 2 {
		t.Errorf("%d pings with calls between every look, want none beyond the first 2", b.pings.Load())
	}
	// Calls stop: the next look a second on pings.
	*b.now = b.now.Add(time.Second)
	b.Check(time.Second)
	b.answer(t, true)
	if b.pings.Load() != 3 {
		t.Errorf("%d pings once calls stopped, want 3", b.pings.Load())
	}
	if got := b.onUp(); !slices.Equal(got, []bool{true, false, true}) {
		t.Errorf("OnUp heard %v, want each change once: [true false true]", got)
	}
}

func TestAPingAnsweredAfterACallLeavesTheCallsAnswer(t *testing.T) {
	b := newPinged()
	b.Check(time.Second) // a ping goes out
	call(b.testBreaker, CallSucceeded)
	b.answer(t, false) // a timeout that began before the call answered
	if !b.Up() {
		t.Error("a ping older than a call's answer overrode it")
	}
}

func TestCheckStartsTheProbeOfAnOpenBreakerWithoutTraffic(t *testing.T) {
	b := newPinged()
	for range BreakerThreshold {
		call(b.testBreaker, CallFailed)
	}
	if b.Check(time.Second) {
		t.Fatal("up with the breaker open")
	}
	*b.now = b.now.Add(BreakerCooldown)
	b.Check(time.Second) // no call comes: the look starts the probe
	b.answers <- true
	b.settled(t)
	if !b.Check(time.Second) || b.pings.Load() != 0 {
		t.Errorf("after the probe answered: up %v, %d pings; want up, and the probe rather than a ping", b.Up(), b.pings.Load())
	}
}

func TestHealthNamesEachDependencyDownOnceAndAReloadStartsFromWhatWasKnown(t *testing.T) {
	if down, watching := Health(time.Second); watching {
		t.Fatalf("breakers watched before any: %v", down)
	}
	pg1, pg2, rd := newPinged(), newPinged(), newPinged()
	stop1 := Watch("postgres", "pg", pg1.Breaker) // knows nothing: pinged at once
	stop2 := Watch("postgres", "pg", pg2.Breaker)
	stopRd := Watch("redis", "rd", rd.Breaker)
	defer stop2()
	defer stopRd()
	if down, watching := Health(time.Second); !watching || !slices.Equal(down, []string{"postgres", "redis"}) {
		t.Fatalf("before any answer: %v %v, want both down (not known to answer)", down, watching)
	}
	pg1.answer(t, true)
	pg2.answer(t, false)
	rd.answer(t, true)
	if down, _ := Health(time.Second); !slices.Equal(down, []string{"postgres"}) {
		t.Fatalf("one of two postgres breakers down: %v, want [postgres]", down)
	}
	call(pg2.testBreaker, CallSucceeded)
	if down, _ := Health(time.Second); len(down) != 0 {
		t.Fatalf("all answered: %v, want none down", down)
	}

	// A reload: a new breaker starts from what the dependency's breakers knew, without
	// a ping, and the old one, taken out, reports nothing more.
	pg3 := newPinged()
	stop3 := Watch("postgres", "pg", pg3.Breaker)
	defer stop3()
	if !pg3.Up() || pg3.pings.Load() != 0 || !slices.Equal(pg3.onUp(), []bool{true}) {
		t.Errorf("the new breaker: up %v after %d pings, OnUp %v; want up at once, no ping, OnUp [true]", pg3.Up(), pg3.pings.Load(), pg3.onUp())
	}
	// Another PostgreSQL (a changed database_url) starts from nothing.
	other := newPinged()
	defer Watch("postgres", "another pg", other.Breaker)()
	if other.Up() {
		t.Error("a breaker of another PostgreSQL started from this one's state")
	}
	other.answer(t, true)

	stop1()
	call(pg1.testBreaker, CallFailed)
	if down, _ := Health(time.Second); len(down) != 0 || !slices.Equal(pg1.onUp(), []bool{true}) {
		t.Errorf("a breaker taken out still reports: down %v, OnUp %v", down, pg1.onUp())
	}
}
