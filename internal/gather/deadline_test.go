package gather_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/gather"
)

func TestDoByStopsWaitingAtItsDeadlineAndTheBatchGoesOn(t *testing.T) {
	f := &gate{started: make(chan []int, 100), release: make(chan struct{})}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour})
	stuck := await(context.Background(), g, 1)
	<-f.started // the lane is busy: the next calls join the pending batch
	patient := awaitBy(context.Background(), g, time.Now().Add(time.Hour), 2)
	start := time.Now()
	_, err := g.DoBy(context.Background(), start.Add(30*time.Millisecond), 3)
	if waited := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || waited < 30*time.Millisecond || waited > 2*time.Second {
		t.Errorf("a call past its deadline = %v after %v, want context.DeadlineExceeded after 30ms", err, waited)
	}
	close(f.release)
	if a := <-stuck; a.resp != 2 || a.err != nil {
		t.Errorf("the call in flight = %+v", a)
	}
	if a := <-patient; a.resp != 4 || a.err != nil {
		t.Errorf("the call whose deadline had not passed = %+v, want its answer", a)
	}
	b := <-f.started
	if slices.Sort(b); fmt.Sprint(b) != "[2 3]" {
		t.Errorf("the batch gathered = %v, want 2 and 3: the late call stays in it", b)
	}
	// The timer of a call answered in time fires for no later call.
	for i := range 20 {
		if resp, err := g.DoBy(context.Background(), time.Now().Add(time.Duration(i)*time.Millisecond), 5); err != nil && !errors.Is(err, context.DeadlineExceeded) || err == nil && resp != 10 {
			t.Fatalf("DoBy %d = %d, %v", i, resp, err)
		}
	}
	if resp, err := g.DoBy(context.Background(), time.Now().Add(time.Hour), 6); resp != 12 || err != nil {
		t.Errorf("DoBy after many timers = %d, %v, want 12", resp, err)
	}
}

// byGate is a gate that also records the deadline every Flush got.
type byGate struct {
	gate
	deadlines []time.Time // guarded by gate.mu
}

func (g *byGate) flush(ctx context.Context, by time.Time, inline bool, reqs []int) ([]int, error) {
	g.mu.Lock()
	g.deadlines = append(g.deadlines, by)
	g.mu.Unlock()
	return g.gate.flush(ctx, by, inline, reqs)
}

func TestFlushGetsTheLatestDeadlineOfItsCallsOrNoneIfOneHasNone(t *testing.T) {
	for _, inline := range []bool{false, true} {
		f := &byGate{gate: gate{started: make(chan []int, 10), release: make(chan struct{})}}
		g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: inline})
		t0 := time.Now().Add(time.Hour)
		var calls []<-chan answer
		calls = append(calls, awaitBy(context.Background(), g, t0, 1)) // alone: its own deadline
		<-f.started
		for i, by := range []time.Time{t0.Add(time.Minute), t0.Add(3 * time.Minute), t0.Add(2 * time.Minute)} {
			calls = append(calls, awaitBy(context.Background(), g, by, 10+i))
		}
		gather.WaitPending(t, g, 3)
		f.release <- struct{}{} // the three go out together
		<-f.started
		// A call without a deadline, and one with an earlier context deadline than
		// its own, in the next batch.
		ctx, cancel := context.WithDeadline(context.Background(), t0.Add(-time.Minute))
		defer cancel()
		calls = append(calls, awaitBy(context.Background(), g, time.Time{}, 20), awaitBy(ctx, g, t0, 21))
		gather.WaitPending(t, g, 2)
		f.release <- struct{}{}
		<-f.started
		close(f.release)
		for _, ch := range calls {
			if a := <-ch; a.err != nil {
				t.Errorf("inline %v: a call = %+v", inline, a)
			}
		}
		want := []time.Time{t0, t0.Add(3 * time.Minute), {}}
		if len(f.deadlines) != len(want) {
			t.Fatalf("inline %v: %d flushes, want %d", inline, len(f.deadlines), len(want))
		}
		for i := range want {
			if !f.deadlines[i].Equal(want[i]) {
				t.Errorf("inline %v: flush %d got deadline %v, want %v", inline, i, f.deadlines[i], want[i])
			}
		}
	}
}

func TestDeadlineIsTheSoonerOfTheContextsAndTheTimeouts(t *testing.T) {
	soon, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ctxDeadline, _ := soon.Deadline()
	for _, c := range []struct {
		name    string
		ctx     context.Context
		timeout time.Duration
		want    time.Duration // from now; 0: zero time; -1: ctx's deadline
	}{
		{"neither", context.Background(), 0, 0},
		{"timeout only", context.Background(), time.Hour, time.Hour},
		{"context only", soon, 0, -1},
		{"context sooner", soon, time.Hour, -1},
		{"timeout sooner", soon, time.Second, time.Second},
	} {
		got := gather.Deadline(c.ctx, c.timeout)
		switch {
		case c.want == 0 && !got.IsZero(), c.want == -1 && !got.Equal(ctxDeadline):
			t.Errorf("%s: Deadline = %v", c.name, got)
		case c.want > 0:
			if d := time.Until(got); d > c.want || d < c.want-time.Second {
				t.Errorf("%s: Deadline is %v from now, want %v", c.name, d, c.want)
			}
		}
	}
}
