package testenv

import (
	"testing"
	"time"
)

func TestWithin(t *testing.T) {
	calls := 0
	if !Within(time.Minute, func() bool { calls++; return true }) || calls != 1 {
		t.Errorf("a condition that holds at once: asked %d times, want once and true", calls)
	}
	calls = 0
	if !Within(time.Minute, func() bool { calls++; return calls == 3 }) || calls != 3 {
		t.Errorf("a condition that holds on the third ask: asked %d times, want 3 and true", calls)
	}
	start := time.Now()
	if Within(20*time.Millisecond, func() bool { return false }) {
		t.Error("a condition that never holds: true")
	}
	if waited := time.Since(start); waited < 20*time.Millisecond || waited > 10*time.Second {
		t.Errorf("a condition that never holds: false after %v, want after its 20ms", waited)
	}
}
