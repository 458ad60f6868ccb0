package conns

import (
	"testing"
	"time"
)

// TestBreakerNeverOpensOnOneSlowRound: the failures of one round, however many, come
// within a spacing of the first: no evidence yet. The breaker stays closed, and the
// next answer wipes them out.
func TestBreakerNeverOpensOnOneSlowRound(t *testing.T) {
	b := newTestBreaker()
	b.Spacing = 100 * time.Millisecond
	for range 3 { // three rounds of 200 calls, each with a success between them
		for range 200 {
			if !call(b, CallFailed) {
				t.Fatal("a call was refused: the breaker opened on one round")
			}
			*b.now = b.now.Add(400 * time.Microsecond) // 200 calls over 80 ms
		}
		*b.now = b.now.Add(time.Second)
		call(b, CallSucceeded)
	}
	if !b.Closed() || len(*b.changes) != 0 {
		t.Errorf("changes %v, want none", *b.changes)
	}
}

// TestBreakerOpensUnderSteadyFailuresOneSpacingOn: a hung dependency under steady
// load fails a call every 10 ms. The breaker opens at the first failure a spacing
// after the first: 100 ms on, not before.
func TestBreakerOpensUnderSteadyFailuresOneSpacingOn(t *testing.T) {
	b := newTestBreaker()
	b.Spacing = 100 * time.Millisecond
	first := *b.now
	for call(b, CallFailed) {
		*b.now = b.now.Add(10 * time.Millisecond)
		if b.now.Sub(first) > time.Second {
			t.Fatal("still closed after a second of failures")
		}
	}
	// The refused call came 10 ms after the one that opened it.
	if opened := b.now.Sub(first) - 10*time.Millisecond; opened != b.Spacing {
		t.Errorf("opened %v after the first failure, want %v", opened, b.Spacing)
	}
}

// TestBreakerOpensOnTheSecondRoundOfLockStepFailures: clients that each wait for their
// answer before asking again fail in waves, one a timeout: 32 calls within 5 ms, then
// 32 more a second later. The first wave leaves the breaker closed; the second opens it.
func TestBreakerOpensOnTheSecondRoundOfLockStepFailures(t *testing.T) {
	b := newTestBreaker()
	b.Spacing = 100 * time.Millisecond
	wave := func() (refused int) {
		for range 32 {
			if !call(b, CallFailed) {
				refused++
			}
			*b.now = b.now.Add(150 * time.Microsecond)
		}
		return refused
	}
	if refused := wave(); refused != 0 || !b.Closed() {
		t.Fatalf("the first wave: %d refused, closed %v; want it through, the breaker closed", refused, b.Closed())
	}
	*b.now = b.now.Add(time.Second)
	if wave(); b.Closed() {
		t.Error("still closed after the second wave")
	}
}

// TestBreakerWithoutSpacingOpensAtTheThreshold: Spacing 0 is the plain rule, the
// threshold's failures in a row, at once.
func TestBreakerWithoutSpacingOpensAtTheThreshold(t *testing.T) {
	b := newTestBreaker()
	for i := range BreakerThreshold {
		if !call(b, CallFailed) {
			t.Fatalf("call %d refused", i+1)
		}
	}
	if b.Closed() {
		t.Error("closed after the threshold's failures")
	}
}
