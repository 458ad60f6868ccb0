package caddymodule

import (
	"context"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// flusherEntry is a background recorder in pools (a keystore.LastUsed or a
// keystore.Usage) with the goroutine that runs it. Every handler with the same
// settings shares it, across config reloads, so a reload neither loses what was
// collected so far nor starts a second flusher. When its last handler goes (a reload
// that changes one of those settings, or a stop), Destruct writes what it holds.
//
// It writes through a PostgreSQL pool in pools, without a reference of its own. Its
// key names that pool's. Every handler holding the entry holds that pool too, and
// gives the entry back before the pool (Cleanup goes through poolKeys backwards). So
// the last flush still has its pool.
type flusherEntry struct {
	rec  any       // *keystore.LastUsed or *keystore.Usage
	log  *flushLog // its lines, to the newest config's logger
	stop context.CancelFunc
	done <-chan struct{}
}

// startFlusher runs run on a goroutine of its own until the entry is destructed.
func startFlusher(rec any, log *flushLog, run func(context.Context)) flusherEntry {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		run(ctx)
	}()
	return flusherEntry{rec: rec, log: log, stop: stop, done: done}
}

// Destruct stops the flusher after one last flush, bounded by the flush timeout.
func (e flusherEntry) Destruct() error {
	e.stop()
	<-e.done
	return nil
}

// flushLog logs a flusher's failed writes, and what it dropped, at most once a minute,
// with how many since the last line: PostgreSQL down fails every flush.
type flushLog struct {
	logger *atomic.Pointer[zap.Logger] // the newest config's logger
	// failedMsg is the line of a failed flush, whose size is told as unit.
	failedMsg, unit string
	// droppedMsg, if set, is the line of requests dropped while the flushes succeed,
	// and the failed line tells the requests dropped too.
	droppedMsg string
	dropped    atomic.Int64 // requests dropped since the last line; Record's callers add
	// Only the flusher's goroutine uses the fields below.
	last   time.Time
	failed int
}

// newFlushLog returns a flushLog writing to logger, until setLogger gives another.
func newFlushLog(logger *zap.Logger, failedMsg, unit, droppedMsg string) *flushLog {
	l := &flushLog{logger: new(atomic.Pointer[zap.Logger]), failedMsg: failedMsg, unit: unit, droppedMsg: droppedMsg}
	l.logger.Store(logger)
	return l
}

// flushed notes the outcome of a flush of n ids or rows.
func (l *flushLog) flushed(n int, err error) {
	if err != nil {
		l.failed++
	}
	if now().Sub(l.last) < time.Minute {
		return
	}
	logger := l.logger.Load()
	switch {
	case err != nil && l.droppedMsg != "":
		logger.Warn(l.failedMsg, zap.Int(l.unit, n), zap.Int("failed_flushes", l.failed),
			zap.Int64("dropped_requests", l.dropped.Swap(0)), zap.Error(err))
	case err != nil:
		logger.Warn(l.failedMsg, zap.Int(l.unit, n), zap.Int("failed_flushes", l.failed), zap.Error(err))
	case l.droppedMsg != "" && l.dropped.Load() > 0:
		logger.Warn(l.droppedMsg, zap.Int("failed_flushes", l.failed), zap.Int64("dropped_requests", l.dropped.Swap(0)))
	default:
		return
	}
	l.last, l.failed = now(), 0
}
