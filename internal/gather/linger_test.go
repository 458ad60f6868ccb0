package gather_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/gather"
)

// stepClock returns a clock that moves on by step each time it is read. A Gatherer
// reads it under its lock, one read a call.
func stepClock(step time.Duration) func() time.Time {
	t := time.Unix(0, 0)
	return func() time.Time {
		t = t.Add(step)
		return t
	}
}

func TestALingeringBatchGoesOutWhenCallsPause(t *testing.T) {
	// Ten calls at once, with a lane free. Without Linger, the first would go alone.
	// With it, the batch waits until calls pause, at least Linger/8 with none. It
	// takes all ten.
	f := &gate{started: make(chan []int, 10)}
	const linger = time.Second
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: true, Linger: linger})
	gather.Prime(g, time.Millisecond, time.Now) // calls were coming a millisecond apart
	start := time.Now()
	var waiting []<-chan answer
	for i := range 10 {
		waiting = append(waiting, await(context.Background(), g, i))
	}
	select {
	case b := <-f.started:
		if elapsed := time.Since(start); len(b) != 10 || elapsed < linger/8 || elapsed >= linger {
			t.Errorf("the batch went out with %v after %v; want all ten calls once they paused, after Linger/8 (%v), before Linger", b, elapsed, linger/8)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lingering batch never went out")
	}
	for _, ch := range waiting {
		if a := <-ch; a.err != nil || a.resp%2 != 0 {
			t.Errorf("answer %+v: want a doubled request and no error", a)
		}
	}
}

func TestALingeringBatchHoldingThePeakGoesOutWithoutThePause(t *testing.T) {
	// Rounds of calls at once, as from a closed loop of clients. The first lingering
	// batch is a probe: it waits for the pause and finds the peak, four. After it, a
	// batch of four goes as its fourth call joins. One of three still waits for the
	// pause. Every 16th lingering batch is a probe again, full or not. A probe of two
	// lowers the peak by a quarter, to three.
	f := &gate{started: make(chan []int, 1)}
	const linger = 2 * time.Second
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: true, Linger: linger})
	gather.Prime(g, time.Millisecond, time.Now)
	lingering := 0 // lingering batches sent
	round := func(calls int, wantPause bool) {
		t.Helper()
		lingering++
		start := time.Now()
		var waiting []<-chan answer
		for i := range calls {
			waiting = append(waiting, await(context.Background(), g, i))
		}
		select {
		case b := <-f.started:
			elapsed := time.Since(start)
			if len(b) != calls {
				t.Fatalf("lingering batch %d went out with %v; want all %d calls", lingering, b, calls)
			}
			if paused := elapsed >= linger/8; paused != wantPause {
				t.Errorf("lingering batch %d of %d calls went out after %v; want it to wait for the pause (Linger/8, %v): %v", lingering, calls, elapsed, linger/8, wantPause)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("lingering batch %d never went out", lingering)
		}
		for _, ch := range waiting {
			if a := <-ch; a.err != nil {
				t.Fatalf("a call of lingering batch %d = %+v", lingering, a)
			}
		}
		gather.WaitFree(t, g, 1)
	}
	round(4, true)  // the first probe: the peak is four
	round(4, false) // full
	round(3, true)  // under the peak
	for lingering < 16 {
		round(4, false)
	}
	round(2, true)  // the 17th: a probe
	round(3, false) // the peak is now three
}

// peakLinger is the Linger of the peak's tests. Its pause, Linger/8, leaves a wide
// margin between a batch that goes at once and one that waits for the pause.
const peakLinger = 2 * time.Second

// peakOfThree returns a Gatherer of lanes lanes lingering for peakLinger. Its gate
// holds each batch until released. A probe of three calls has set its peak to three.
func peakOfThree(t *testing.T, lanes int) (*gate, *gather.Gatherer[int, int]) {
	t.Helper()
	f := &gate{started: make(chan []int, 8), release: make(chan struct{}, 1)}
	g := gather.New(f.flush, gather.Options{Lanes: lanes, MaxWait: time.Hour, Linger: peakLinger})
	gather.Prime(g, time.Millisecond, time.Now)
	f.release <- struct{}{}
	answeredAll(t, awaitEach(g, 0, 3)) // the probe
	<-f.started
	gather.WaitFree(t, g, lanes)
	return f, g
}

func TestAPeakGrowsWhenACallComesWhileAFullBatchIsOut(t *testing.T) {
	// A probe of three sets the peak. Three more calls go as the third joins. While
	// their batch is out, a call comes that is none of theirs. So the peak grows to
	// four, and the batch it starts goes once four have joined.
	f, g := peakOfThree(t, 2)

	start := time.Now()
	out := awaitEach(g, 10, 3) // full: goes at once, and stays out
	if b := <-f.started; len(b) != 3 || time.Since(start) >= peakLinger/8 {
		t.Fatalf("three calls at a peak of three went out as %v after %v; want them at once", b, time.Since(start))
	}
	start = time.Now()
	more := awaitEach(g, 20, 1)
	gather.WaitPending(t, g, 1)
	more = append(more, awaitEach(g, 21, 3)...)
	if b := <-f.started; len(b) != 4 || time.Since(start) >= peakLinger/8 {
		t.Errorf("four calls, the first while a full batch was out, went out as %v after %v; want one batch of four, at once", b, time.Since(start))
	}
	close(f.release)
	answeredAll(t, out)
	answeredAll(t, more)
}

func TestAPeakFollowsAFullBatchThatGrewWaitingForALane(t *testing.T) {
	// A probe of three sets the peak. Three more calls go at once and hold the one
	// lane. Five calls gather meanwhile. They are full at four, after the first
	// raised the peak, but no lane is free. They go when it comes free. The peak is
	// now five, and five calls go at once.
	f, g := peakOfThree(t, 1)

	out := awaitEach(g, 10, 3) // full: goes at once, and holds the lane
	<-f.started
	grown := awaitEach(g, 20, 5)
	gather.WaitPending(t, g, 5)
	close(f.release)
	if b := <-f.started; len(b) != 5 {
		t.Fatalf("five calls gathered while the lane was busy went out as %v; want one batch", b)
	}
	answeredAll(t, out)
	answeredAll(t, grown)
	gather.WaitFree(t, g, 1)

	start := time.Now()
	waiting := awaitEach(g, 30, 5)
	if b := <-f.started; len(b) != 5 || time.Since(start) >= peakLinger/8 {
		t.Errorf("five calls after a batch of five went out as %v after %v; want all five at once", b, time.Since(start))
	}
	answeredAll(t, waiting)
}

func TestALingeringBatchGoesOutAfterLingerWhileCallsKeepComing(t *testing.T) {
	// A call every millisecond for 300 ms never pauses for Linger/8 (12.5 ms). So
	// batches go out Linger (100 ms) after their first call: a few large ones.
	f := &gate{}
	const linger = 100 * time.Millisecond
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: true, Linger: linger})
	gather.Prime(g, time.Millisecond, time.Now)
	var waiting []<-chan answer
	// A call every millisecond: load spread over time on purpose.
	for end := time.Now().Add(3 * linger); time.Now().Before(end); time.Sleep(time.Millisecond) {
		waiting = append(waiting, await(context.Background(), g, len(waiting)))
	}
	for _, ch := range waiting {
		if a := <-ch; a.err != nil {
			t.Fatalf("a call = %+v", a)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := len(f.batches); n < 3 || n > len(waiting)/10 {
		t.Errorf("%d calls over 3 Lingers went in %d batches; want 3 or a few more (Linger ends each), not one a call", len(waiting), n)
	}
}

func TestCallsComingFewerThanFourALingerGoAtOnce(t *testing.T) {
	for _, inline := range []bool{false, true} {
		f := &gate{}
		g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: inline, Linger: time.Hour})
		// Calls come 20 minutes apart: three a Linger, too few to wait for.
		gather.Prime(g, 20*time.Minute, stepClock(20*time.Minute))
		for i := range 3 {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := g.Do(ctx, i)
			cancel()
			if resp != 2*i || err != nil {
				t.Fatalf("inline %v: Do(%d) = %d, %v; want %d at once", inline, i, resp, err, 2*i)
			}
		}
		if len(f.batches) != 3 {
			t.Errorf("inline %v: three slow calls made batches %v; want three of one", inline, f.batches)
		}
	}
}

func TestABurstAfterALongIdleSpellLingersWithinADozenCalls(t *testing.T) {
	g := gather.New((&gate{}).flush, gather.Options{Linger: time.Hour})
	now := time.Unix(0, 0)
	gather.Prime(g, time.Minute, func() time.Time { return now }) // lingering
	now = now.Add(1000 * time.Hour)
	if gather.Arrive(g) {
		t.Fatal("the first call after 1000 idle hours would linger")
	}
	for i := range 16 {
		now = now.Add(time.Minute)
		if gather.Arrive(g) {
			t.Logf("lingering again at the %d. call of the burst", i+1)
			return
		}
	}
	t.Error("16 calls a minute apart after a long idle spell, and still no lingering: the idle spell weighs too much")
}

func TestALaneComingFreeLeavesALingeringBatchToItsTimer(t *testing.T) {
	f := &gate{started: make(chan []int, 10), release: make(chan struct{})}
	const linger = time.Second
	g := gather.New(f.flush, gather.Options{Lanes: 2, MaxWait: time.Hour, Inline: true, Linger: linger})
	gather.Prime(g, time.Millisecond, time.Now)
	var first []<-chan answer
	for i := range 5 {
		first = append(first, await(context.Background(), g, i))
	}
	<-f.started // the first batch, held
	start := time.Now()
	var second []<-chan answer
	for i := range 3 {
		second = append(second, await(context.Background(), g, 100+i))
	}
	gather.WaitPending(t, g, 3) // the three joined the second batch, which lingers
	f.release <- struct{}{}     // the first batch returns and frees its lane
	for _, ch := range first {
		<-ch
	}
	close(f.release)
	select {
	case b := <-f.started:
		if elapsed := time.Since(start); elapsed < linger/8 || len(b) != 3 {
			t.Errorf("the second batch went out with %v after %v; want its three calls once they paused for Linger/8 (%v)", b, elapsed, linger/8)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the second batch never went out")
	}
	for _, ch := range second {
		if a := <-ch; a.err != nil || a.resp < 200 {
			t.Errorf("a call of the second batch = %+v", a)
		}
	}
}

func TestAfterAnIdleSpellCallsGoAtOnce(t *testing.T) {
	f := &gate{}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: true, Linger: time.Hour})
	// Primed as if calls had come a minute apart: 60 a Linger, so lingering. Then ten
	// hours pass. The call after them finds the rate too low to wait for.
	gather.Prime(g, time.Minute, stepClock(10*time.Hour))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := g.Do(ctx, 1); resp != 2 || err != nil {
		t.Fatalf("Do after an idle spell = %d, %v; want 2 at once", resp, err)
	}
}

func TestACallerWhoseContextEndsStopsLingering(t *testing.T) {
	f := &gate{started: make(chan []int, 10)}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: true, Linger: time.Second})
	gather.Prime(g, time.Millisecond, time.Now)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	impatient := await(ctx, g, 1)
	patient := await(context.Background(), g, 2)
	if a := <-impatient; !errors.Is(a.err, context.DeadlineExceeded) {
		t.Errorf("the call whose context ended = %+v, want context.DeadlineExceeded", a)
	}
	select {
	case b := <-f.started:
		t.Errorf("batch %v went out before its calls paused for Linger/8", b)
	default:
	}
	if a := <-patient; a.resp != 4 || a.err != nil {
		t.Errorf("the other call of the lingering batch = %+v, want 4", a)
	}
	if b := <-f.started; len(b) != 2 {
		t.Errorf("the lingering batch held %v, want both calls", b)
	}
}

func TestAnInlineCallEndingLeavesALingeringBatchToItsTimer(t *testing.T) {
	f := &gate{started: make(chan []int, 10), release: make(chan struct{})}
	g := gather.New(f.flush, gather.Options{Lanes: 2, MaxWait: time.Hour, Inline: true, Linger: time.Hour})
	// The clock stands still, so every call shortens the gap by an eighth. The first
	// call finds just under four calls a Linger, and goes alone. The second finds more
	// and lingers. With the clock still, it is never due.
	gather.Prime(g, 17*time.Minute+12*time.Second, func() time.Time { return time.Unix(0, 0) })
	lone := await(context.Background(), g, 1)
	if b := <-f.started; len(b) != 1 {
		t.Fatalf("the first call went out as %v, want alone", b)
	}
	ctx, cancel := context.WithCancel(context.Background())
	lingering := await(ctx, g, 2)
	gather.WaitPending(t, g, 1)
	f.release <- struct{}{} // the lone call returns and frees its lane
	<-lone
	select {
	case b := <-f.started:
		t.Errorf("batch %v went out when the lone call's lane came free, before it was due", b)
	case <-time.After(100 * time.Millisecond):
	}
	cancel()
	if a := <-lingering; !errors.Is(a.err, context.Canceled) {
		t.Errorf("the lingering call = %+v, want context.Canceled", a)
	}
	close(f.release)
}

func TestLingeringStopsWhileItGathersTooLittle(t *testing.T) {
	// One caller calling back to back: fast, but a lingering batch never gathers
	// more than its one call. After such a batch, the next 64 go at once. Then one
	// lingers again, to see whether that pays now.
	f := &gate{}
	const linger = 400 * time.Millisecond
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: true, Linger: linger})
	gather.Prime(g, time.Millisecond, time.Now)
	call := func(i int) time.Duration {
		start := time.Now()
		if resp, err := g.Do(context.Background(), i); resp != 2*i || err != nil {
			t.Fatalf("Do(%d) = %d, %v", i, resp, err)
		}
		return time.Since(start)
	}
	if took := call(1); took < linger/8 {
		t.Fatalf("the first call took %v; want it to linger, at least Linger/8 (%v)", took, linger/8)
	}
	var took time.Duration
	for i := range 64 {
		took += call(2 + i)
	}
	if took >= linger/8 {
		t.Errorf("the 64 calls after a lingering batch of one took %v in all; want them at once", took)
	}
	if took := call(66); took < linger/8 {
		t.Errorf("the 66th call took %v; want it to linger again, at least Linger/8 (%v)", took, linger/8)
	}
}

func TestALingeringBatchBehindAStuckOneGoesOutAfterLingerAndMaxWait(t *testing.T) {
	// The batch of requests 1 and 10–13 is stuck until the end of the test. Request 2
	// starts a lingering batch while the lane is busy. Once due, after a pause of
	// Linger/8, it waits for the lane as any batch does. It goes out on its own after
	// MaxWait. The first batch holds five calls, so that lingering pays and goes on.
	unstick := make(chan struct{})
	started := make(chan time.Time, 2)
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
		started <- time.Now()
		if slices.Contains(reqs, 1) {
			<-unstick
		}
		return append([]int(nil), reqs...), nil
	}
	const linger, maxWait = 80 * time.Millisecond, 30 * time.Millisecond
	g := gather.New(flush, gather.Options{MaxWait: maxWait, Linger: linger})
	gather.Prime(g, time.Millisecond, time.Now)
	var stuck []<-chan answer
	for _, req := range []int{1, 10, 11, 12, 13} {
		stuck = append(stuck, await(context.Background(), g, req))
	}
	<-started
	joined := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if resp, err := g.Do(ctx, 2); resp != 2 || err != nil {
		t.Errorf("the call behind a stuck batch = %d, %v", resp, err)
	}
	select {
	case at := <-started:
		if d := at.Sub(joined); d < linger/8+maxWait {
			t.Errorf("the batch went out %v after its call joined, before Linger/8 + MaxWait (%v) with the lane busy", d, linger/8+maxWait)
		}
	case <-time.After(5 * time.Second):
		close(unstick)
		t.Fatal("the lingering batch behind the stuck one never went out")
	}
	close(unstick)
	for _, ch := range stuck {
		if a := <-ch; a.err != nil {
			t.Errorf("a stuck call = %+v", a)
		}
	}
}
