package flaplog

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// clock is a Log's time, moved by the test, and its held telling, run by the test.
type clock struct {
	now  time.Time
	due  time.Time // when the held changes are told; zero: none due
	held func()
}

func newTestLog(c *clock, lines *[]string) *Log {
	l := New(false, time.Minute, func(state bool, changes int) {
		*lines = append(*lines, fmt.Sprintf("%s %v %d", c.now.Format("15:04:05"), state, changes))
	})
	l.now = func() time.Time { return c.now }
	l.after = func(d time.Duration, f func()) {
		if c.held != nil {
			panic("a second telling scheduled while one is due")
		}
		c.due, c.held = c.now.Add(d), f
	}
	return l
}

// advance moves the clock to t, running the held telling if it is due by then.
func (c *clock) advance(t time.Time) {
	if c.held != nil && !c.due.After(t) {
		c.now = c.due
		f := c.held
		c.due, c.held = time.Time{}, nil
		f()
	}
	c.now = t
}

func TestLogTellsAChangeOnceThenAtMostOnceAMinuteWithTheCount(t *testing.T) {
	start := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	type step struct {
		at    time.Duration // after start
		state bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
		end   time.Duration // the clock's last move
		want  []string
	}{
		{"a single change, told at once", []step{{5 * time.Second, true}}, 10 * time.Minute,
			[]string{"10:00:05 true 1"}},
		{"changes a quiet minute apart, each told at once",
			[]step{{0, true}, {2 * time.Minute, false}, {4 * time.Minute, true}}, 10 * time.Minute,
			[]string{"10:00:00 true 1", "10:02:00 false 1", "10:04:00 true 1"}},
		{"a standby crossing its lag every 3s: one line a minute, the last telling where it ended",
			func() (s []step) {
				for i := range 30 { // 10:00:00 in, 10:00:03 out, … 10:01:27 out
					s = append(s, step{time.Duration(i) * 3 * time.Second, i%2 == 0})
				}
				return s
			}(), 10 * time.Minute,
			[]string{"10:00:00 true 1", "10:01:00 false 19", "10:02:00 false 10"}},
		{"a change back to the state told is told with its count",
			[]step{{0, true}, {10 * time.Second, false}, {20 * time.Second, true}}, 10 * time.Minute,
			[]string{"10:00:00 true 1", "10:01:00 true 2"}},
		{"the same state twice is no change", []step{{0, true}, {time.Second, true}}, 10 * time.Minute,
			[]string{"10:00:00 true 1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &clock{now: start}
			var lines []string
			l := newTestLog(c, &lines)
			for _, s := range tc.steps {
				c.advance(start.Add(s.at))
				l.Change(s.state)
			}
			c.advance(start.Add(tc.end))
			if !slices.Equal(lines, tc.want) {
				t.Errorf("lines:\n%q\nwant:\n%q", lines, tc.want)
			}
		})
	}
}
