package conns

import (
	"testing"
	"time"
)

// TestBreakerCountsOneSlowRoundAsOneFailure: the failures of one round, however many,
// come within a spacing of each other and count once. The breaker stays closed, and
// the next answer wipes them out.
func TestBreakerCountsOneSlowRoundAsOneFailure(t *testing.T) {
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

// TestBreakerOpensUnderSteadyFailuresWithinFourSpacings: a hung dependency under load
// fails a call every 10 ms. The breaker opens at the fifth failure a spacing apart:
// 400 ms after the first, not before.
func TestBreakerOpensUnderSteadyFailuresWithinFourSpacings(t *testing.T) {
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
	if opened := b.now.Sub(first) - 10*time.Millisecond; opened != 4*b.Spacing {
		t.Errorf("opened %v after the first failure, want %v", opened, 4*b.Spacing)
	}
}
