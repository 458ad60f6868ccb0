// Package flaplog tells the changes of a state that may flap, such as a server
// taken in and out of use: a change at once, then, while the state keeps changing,
// at most once an interval, with the number of changes since the last line. A
// server that crosses a threshold every few seconds then writes one line a minute
// instead of one a crossing, and the last line always tells its state.
package flaplog

import (
	"sync"
	"time"
)

// Log tells the changes of one state to its tell function. It is safe for
// concurrent use; tell runs with the Log's lock held, so lines keep their order.
type Log struct {
	every time.Duration
	tell  func(state bool, changes int)
	// now is the clock, and after runs f once d has passed (time.AfterFunc): seams
	// for tests.
	now   func() time.Time
	after func(d time.Duration, f func())

	mu      sync.Mutex
	state   bool      // the state last changed to
	told    time.Time // when tell last ran; zero: never
	changes int       // changes since then
	held    bool      // a telling of the changes held is due
}

// New returns a Log whose state starts as initial, calling tell at most once every
// interval.
func New(initial bool, every time.Duration, tell func(state bool, changes int)) *Log {
	return &Log{every: every, tell: tell, state: initial, now: time.Now,
		after: func(d time.Duration, f func()) { time.AfterFunc(d, f) }}
}

// Change notes that the state is now state. A change after a quiet interval is told
// at once. One sooner is held, and told with the others held when the interval since
// the last line ends, whether or not the state changes again meanwhile. A state
// equal to the last one is no change.
func (l *Log) Change(state bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if state == l.state {
		return
	}
	l.state = state
	l.changes++
	if wait := l.every - l.now().Sub(l.told); l.told.IsZero() || wait <= 0 {
		l.flush()
	} else if !l.held {
		l.held = true
		l.after(wait, l.flushHeld)
	}
}

// flushHeld tells the changes held, when the interval has ended.
func (l *Log) flushHeld() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = false
	if l.changes > 0 {
		l.flush()
	}
}

// flush tells the state and the changes since the last line. l.mu must be held.
func (l *Log) flush() {
	l.tell(l.state, l.changes)
	l.told, l.changes = l.now(), 0
}
