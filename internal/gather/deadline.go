package gather

import (
	"context"
	"sync"
	"time"
)

// This file holds the deadlines: how long a call waits, and the deadline its batch's
// Flush gets.

// Deadline is the deadline of a call that its caller bounds by timeout: the sooner of
// ctx's deadline and timeout from now. It is zero if there is neither. A timeout of 0
// is none.
func Deadline(ctx context.Context, timeout time.Duration) time.Time {
	d, ok := ctx.Deadline()
	if timeout > 0 {
		if t := time.Now().Add(timeout); !ok || t.Before(d) {
			return t
		}
	}
	return d
}

// wait waits for the answer of call i of batch b, which others send. It stops when ctx
// ends or deadline passes (zero: none).
func (g *Gatherer[Req, Resp]) wait(ctx context.Context, deadline time.Time, b *batch[Req, Resp], i int) (Resp, error) {
	var zero Resp
	var expired <-chan time.Time
	if !deadline.IsZero() {
		t := timers.Get().(*time.Timer)
		t.Reset(time.Until(deadline))
		defer putTimer(t)
		expired = t.C
	}
	select {
	case <-b.done:
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-expired:
		return zero, context.DeadlineExceeded
	}
	if b.err != nil {
		return zero, b.err
	}
	return b.resps[i], nil
}

// timers are the stopped timers of wait.
var timers = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}}

// putTimer stops t and gives it back to timers, with nothing stale in t.C. Since Go
// 1.23 Stop sees to that. The drain is for a main module built with asynctimerchan=1.
func putTimer(t *time.Timer) {
	if !t.Stop() {
		select {
		case <-t.C:
		default:
		}
	}
	timers.Put(t)
}

// bound counts a call's deadline (zero: none) into b's, the latest of its calls'. It
// must be called with mu held.
func (b *batch[Req, Resp]) bound(deadline time.Time) {
	if deadline.IsZero() {
		b.unbound = true
	} else if deadline.After(b.by) {
		b.by = deadline
	}
}

// deadline is what Flush gets for b: the latest deadline of its calls. It is zero if
// one of them has none.
func (b *batch[Req, Resp]) deadline() time.Time {
	if b.unbound {
		return time.Time{}
	}
	return b.by
}
