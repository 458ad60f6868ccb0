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
	// stopCuts has a stop cut a flush in progress short, for the last flush to take
	// over. LastUsed's may: the ids of a cut flush are noted again, and written by the
	// last. Usage's may not: a cut write may or may not have been made, and must be
	// sent again.
	stopCuts bool
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

// run flushes every interval until ctx ends, then flushes once more and returns. The
// last flush runs to its end or its timeout, whatever becomes of ctx, so that a stop
// never cuts the last writes short. So do the others, unless stopCuts.
func (f flusher) run(ctx context.Context) {
	tick := time.NewTicker(f.interval)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			if f.stopCuts {
				f.flushWithTimeout(ctx)
			} else {
				f.flushWithTimeout(context.WithoutCancel(ctx))
			}
		case <-ctx.Done():
			f.flushWithTimeout(context.WithoutCancel(ctx))
			return
		}
	}
}

func (f flusher) flushWithTimeout(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	_ = f.flush(ctx) // reported through the owner's OnFlush
}
