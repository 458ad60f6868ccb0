package gather

import "time"

// Prime sets g's clock and the moving average of the time between calls, as if calls
// had been arriving gap apart until now().
func Prime[Req, Resp any](g *Gatherer[Req, Resp], gap time.Duration, now func() time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.now, g.gap, g.last = now, gap, now()
}

// Arrive counts one call's arrival, as Do does, and tells whether a batch started now
// would linger.
func Arrive[Req, Resp any](g *Gatherer[Req, Resp]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, fast := g.arrive()
	return fast
}

// SetWorkerIdle sets how long g's worker goroutines wait for another batch before
// they end; call it before g's first call.
func SetWorkerIdle[Req, Resp any](g *Gatherer[Req, Resp], idle time.Duration) {
	g.idle = idle
}
