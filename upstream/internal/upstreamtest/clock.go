package upstreamtest

import (
	"sync"
	"time"
)

// Clock is a Config.Now that moves only when told.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// NewClock returns a Clock at the current second.
func NewClock() *Clock { return &Clock{t: time.Now().Truncate(time.Second)} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock forward by d.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}
