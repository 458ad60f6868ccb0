package keystore

import (
	"context"
	"time"
)

// flusher is the life that LastUsed and Usage share: they collect in memory, and a
// flusher writes what they hold every interval, and once more when it is stopped.
// Both drop and count what they cannot hold (their MaxPending and OnDrop); that part
// is theirs, since what they hold differs.
type flusher struct {
	interval time.Duration
	timeout  time.Duration // bounds one flush
	flush    func(context.Context) error
}

// newFlusher returns a flusher of flush, with interval and timeout defaulted:
// interval to defaultInterval, timeout to the interval, at most maxTimeout.
func newFlusher(flush func(context.Context) error, interval, timeout, defaultInterval, maxTimeout time.Duration) flusher {
	if interval <= 0 {
		interval = defaultInterval
	}
	if timeout <= 0 {
		timeout = min(interval, maxTimeout)
	}
	return flusher{interval: interval, timeout: timeout, flush: flush}
}

// run flushes every interval until ctx ends, then flushes once more and returns. Each
// flush, the last one included, runs to its end or its timeout, whatever becomes of
// ctx, so that a stop never cuts the last writes short.
func (f flusher) run(ctx context.Context) {
	tick := time.NewTicker(f.interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			f.flushWithTimeout(ctx)
		case <-ctx.Done():
			f.flushWithTimeout(ctx)
			return
		}
	}
}

func (f flusher) flushWithTimeout(ctx context.Context) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), f.timeout)
	defer cancel()
	_ = f.flush(ctx) // reported through the owner's OnFlush
}
