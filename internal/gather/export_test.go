package gather

import (
	"fmt"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

// Prime sets g's clock and the gap (see lingerPolicy). It is as if calls had been
// arriving gap apart until now().
func Prime[Req, Resp any](g *Gatherer[Req, Resp], gap time.Duration, now func() time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.linger.now, g.linger.gap, g.linger.last = now, gap, now()
}

// Arrive counts one call's arrival, as Do does. It tells whether a batch started now
// would linger.
func Arrive[Req, Resp any](g *Gatherer[Req, Resp]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, fast := g.linger.arrive()
	return fast
}

// SetWorkerIdle sets how long g's worker goroutines wait for another batch before
// they end. Call it before g's first call.
func SetWorkerIdle[Req, Resp any](g *Gatherer[Req, Resp], idle time.Duration) {
	g.idle = idle
}

// WaitFree waits until every lane of g is free and no batch is pending. The worker
// that sent the last batch has then looked for another, and found none.
func WaitFree[Req, Resp any](tb testing.TB, g *Gatherer[Req, Resp], lanes int) {
	tb.Helper()
	testenv.Eventually(tb, 10*time.Second, fmt.Sprintf("%d lanes free and nothing pending", lanes), func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.free == lanes && g.pending == nil
	})
}

// WaitPending waits until the batch not yet sent holds n calls: the calls made
// meanwhile have all joined it.
func WaitPending[Req, Resp any](tb testing.TB, g *Gatherer[Req, Resp], n int) {
	tb.Helper()
	testenv.Eventually(tb, 10*time.Second, fmt.Sprintf("%d calls pending", n), func() bool { return Pending(g, n) })
}

// Pending tells whether the batch not yet sent holds n calls.
func Pending[Req, Resp any](g *Gatherer[Req, Resp], n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.pending != nil && len(g.pending.reqs) == n
}

// WaitWorkersWaiting waits until n worker goroutines (of any Gatherer) wait for a
// batch, in the select of worker. A lane freed is not yet a worker waiting there: a
// batch dispatched in between goes to a new worker.
func WaitWorkersWaiting(tb testing.TB, n int) {
	tb.Helper()
	testenv.Eventually(tb, 10*time.Second, fmt.Sprintf("%d workers waiting for a batch", n), func() bool {
		return testenv.Goroutines(" [select", "gather.(*Gatherer[", "]).worker(") == n
	})
}
