package gather_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/gather"
	"github.com/keygate/keygate/internal/testkit/testenv"
)

// gate is a Flush that doubles every request and records every batch. While closed,
// it holds each batch until the test lets one go.
type gate struct {
	mu      sync.Mutex
	batches [][]int
	started chan []int    // each batch as it starts, if non-nil
	release chan struct{} // a batch waits for a value here, if non-nil
	err     error         // the answer of every batch, if set
	running atomic.Int32
	most    atomic.Int32 // the most batches that ran at once
}

func (g *gate) flush(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
	n := g.running.Add(1)
	defer g.running.Add(-1)
	for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
	}
	batch := append([]int(nil), reqs...)
	g.mu.Lock()
	g.batches = append(g.batches, batch)
	g.mu.Unlock()
	if g.started != nil {
		g.started <- batch
	}
	if g.release != nil {
		<-g.release
	}
	g.mu.Lock()
	err := g.err
	g.mu.Unlock()
	if err != nil {
		return nil, err
	}
	out := make([]int, len(reqs))
	for i, r := range reqs {
		out[i] = 2 * r
	}
	return out, nil
}

func (g *gate) setErr(err error) {
	g.mu.Lock()
	g.err = err
	g.mu.Unlock()
}

// await calls Do(req) on a goroutine of its own. It returns where the answer will be.
type answer struct {
	resp int
	err  error
}

func await(ctx context.Context, g *gather.Gatherer[int, int], req int) <-chan answer {
	deadline, _ := ctx.Deadline()
	return awaitBy(ctx, g, deadline, req)
}

// awaitEach awaits n calls at once, of requests from, from+1, …
func awaitEach(g *gather.Gatherer[int, int], from, n int) []<-chan answer {
	var waiting []<-chan answer
	for i := range n {
		waiting = append(waiting, await(context.Background(), g, from+i))
	}
	return waiting
}

// answeredAll waits for every answer of waiting, and fails t at the first error.
func answeredAll(t *testing.T, waiting []<-chan answer) {
	t.Helper()
	for _, ch := range waiting {
		if a := <-ch; a.err != nil {
			t.Fatalf("a call = %+v", a)
		}
	}
}

// awaitBy is await with DoBy's deadline.
func awaitBy(ctx context.Context, g *gather.Gatherer[int, int], deadline time.Time, req int) <-chan answer {
	ch := make(chan answer, 1)
	go func() {
		resp, err := g.DoBy(ctx, deadline, req)
		ch <- answer{resp, err}
	}()
	return ch
}

func TestALoneCallIsSentAtOnceAndGetsItsOwnAnswer(t *testing.T) {
	f := &gate{}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour})
	for i := range 3 {
		if resp, err := g.Do(context.Background(), i); resp != 2*i || err != nil {
			t.Fatalf("Do(%d) = %d, %v; want %d, nil", i, resp, err, 2*i)
		}
	}
	if len(f.batches) != 3 {
		t.Errorf("three calls one after the other made batches %v; want three of one", f.batches)
	}
}

func TestCallsArrivingDuringARoundTripShareTheNextBatch(t *testing.T) {
	f := &gate{started: make(chan []int, 10), release: make(chan struct{})}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour})
	first := await(context.Background(), g, 100)
	if b := <-f.started; len(b) != 1 || b[0] != 100 {
		t.Fatalf("first batch %v, want [100]", b)
	}
	// While the first batch is in flight, every call joins one pending batch.
	var waiting []<-chan answer
	for i := range 50 {
		waiting = append(waiting, await(context.Background(), g, i))
	}
	gather.WaitPending(t, g, 50) // all 50 joined, and none may have gone out meanwhile
	select {
	case b := <-f.started:
		t.Fatalf("batch %v went out while the lane was busy", b)
	default:
	}
	f.release <- struct{}{}
	if a := <-first; a.resp != 200 || a.err != nil {
		t.Errorf("first call = %+v", a)
	}
	if b := <-f.started; len(b) != 50 {
		t.Errorf("second batch holds %d calls, want all 50", len(b))
	}
	close(f.release)
	got := map[int]bool{}
	for _, ch := range waiting {
		a := <-ch
		if a.err != nil || a.resp%2 != 0 || got[a.resp] {
			t.Errorf("answer %+v: want a distinct doubled request and no error", a)
		}
		got[a.resp] = true
	}
}

func TestACallNeverJoinsABatchAlreadySent(t *testing.T) {
	// Freshness: a call made while a batch is in flight is in a later batch.
	f := &gate{started: make(chan []int, 10), release: make(chan struct{})}
	g := gather.New(f.flush, gather.Options{Lanes: 2, MaxWait: time.Hour})
	a := await(context.Background(), g, 1)
	<-f.started
	b := await(context.Background(), g, 2) // takes the second lane
	if got := <-f.started; len(got) != 1 || got[0] != 2 {
		t.Fatalf("second batch %v, want [2] on the second lane", got)
	}
	c := await(context.Background(), g, 3) // both lanes busy: waits
	close(f.release)
	for _, ch := range []<-chan answer{a, b, c} {
		if r := <-ch; r.err != nil {
			t.Fatal(r.err)
		}
	}
	for i, batch := range f.batches {
		if len(batch) != 1 || batch[0] != i+1 {
			t.Errorf("batches %v; want [[1] [2] [3]]", f.batches)
			break
		}
	}
}

func TestAtMostLanesBatchesRunAtOnce(t *testing.T) {
	for _, lanes := range []int{1, 3} {
		f := &gate{}
		slow := func(ctx context.Context, by time.Time, inline bool, reqs []int) ([]int, error) {
			time.Sleep(time.Millisecond) // a flush that takes time, on purpose
			return f.flush(ctx, by, inline, reqs)
		}
		g := gather.New(slow, gather.Options{Lanes: lanes, MaxWait: time.Hour})
		var wg sync.WaitGroup
		for i := range 64 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 20 {
					req := i*100 + j
					if resp, err := g.Do(context.Background(), req); resp != 2*req || err != nil {
						t.Errorf("Do(%d) = %d, %v", req, resp, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if most := f.most.Load(); most > int32(lanes) {
			t.Errorf("%d lanes: %d batches ran at once", lanes, most)
		}
		calls := 0
		for _, b := range f.batches {
			calls += len(b)
		}
		if calls != 64*20 || len(f.batches) >= calls {
			t.Errorf("%d lanes: %d calls in %d batches; want 1280 calls, batched", lanes, calls, len(f.batches))
		}
	}
}

func TestABatchWaitsAtMostMaxWaitForALane(t *testing.T) {
	// The batch of request 1 is stuck until the end of the test. The one of request 2
	// must go out on its own after MaxWait, and answer.
	unstick := make(chan struct{})
	started := make(chan time.Time, 2)
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
		started <- time.Now()
		if reqs[0] == 1 {
			<-unstick
		}
		return append([]int(nil), reqs...), nil
	}
	const maxWait = 30 * time.Millisecond
	g := gather.New(flush, gather.Options{MaxWait: maxWait})
	stuck := await(context.Background(), g, 1)
	<-started
	joined := time.Now()
	if resp, err := g.Do(context.Background(), 2); resp != 2 || err != nil {
		t.Errorf("the call behind a stuck batch = %d, %v", resp, err)
	}
	if d := (<-started).Sub(joined); d < maxWait {
		t.Errorf("the batch went out %v after its call joined, before its MaxWait %v with the lane busy", d, maxWait)
	}
	close(unstick)
	if a := <-stuck; a.resp != 1 || a.err != nil {
		t.Errorf("the stuck call = %+v", a)
	}
}

func TestACallerWhoseContextEndsStopsWaitingAlone(t *testing.T) {
	f := &gate{started: make(chan []int, 10), release: make(chan struct{})}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	impatient := await(ctx, g, 1)
	patient := await(context.Background(), g, 2)
	<-f.started // one of the two is in flight, the other in it or pending
	cancel()
	if a := <-impatient; !errors.Is(a.err, context.Canceled) {
		t.Errorf("cancelled call = %+v, want context.Canceled while its batch is in flight", a)
	}
	dctx, dcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer dcancel()
	if _, err := g.Do(dctx, 3); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("call past its deadline = %v, want context.DeadlineExceeded", err)
	}
	close(f.release)
	if a := <-patient; a.resp != 4 || a.err != nil {
		t.Errorf("the other caller = %+v; want its answer despite the cancellation", a)
	}
	// The gatherer carries on.
	if resp, err := g.Do(context.Background(), 5); resp != 10 || err != nil {
		t.Errorf("Do after the cancellation = %d, %v", resp, err)
	}
}

func TestABatchErrorIsEveryCallersAndTheNextBatchRecovers(t *testing.T) {
	boom := errors.New("backend down")
	f := &gate{started: make(chan []int, 10), release: make(chan struct{}), err: boom}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour})
	first := await(context.Background(), g, 1)
	<-f.started
	var rest []<-chan answer
	for i := range 5 {
		rest = append(rest, await(context.Background(), g, 10+i))
	}
	close(f.release)
	for _, ch := range append(rest, first) {
		if a := <-ch; a.err != boom || a.resp != 0 {
			t.Errorf("call = %+v, want its batch's error", a)
		}
	}
	f.setErr(nil) // the backend is back
	if resp, err := g.Do(context.Background(), 7); resp != 14 || err != nil {
		t.Errorf("Do after the failed batches = %d, %v", resp, err)
	}
}

func TestErrorsOfSingleCallsStayTheirs(t *testing.T) {
	type reply struct {
		n   int
		err error
	}
	odd := errors.New("odd")
	started, release := make(chan struct{}, 20), make(chan struct{})
	var sizes []int
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]reply, error) {
		started <- struct{}{}
		<-release
		sizes = append(sizes, len(reqs))
		out := make([]reply, len(reqs))
		for i, r := range reqs {
			if r%2 == 1 {
				out[i].err = odd
			} else {
				out[i].n = r
			}
		}
		return out, nil
	}
	g := gather.New(flush, gather.Options{MaxWait: time.Hour})
	var wg sync.WaitGroup
	for i := range 20 {
		if i == 1 {
			<-started // the first call's batch holds the lane: the other 19 gather
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := g.Do(context.Background(), i)
			if err != nil || i%2 == 1 && r.err != odd || i%2 == 0 && (r.err != nil || r.n != i) {
				t.Errorf("Do(%d) = %+v, %v", i, r, err)
			}
		}()
	}
	gather.WaitPending(t, g, 19)
	close(release)
	wg.Wait()
	sum := 0
	for _, n := range sizes {
		sum += n
	}
	if sum != 20 {
		t.Errorf("batches of %v calls; want 20 in all", sizes)
	}
}

func TestAFlushAnsweringTheWrongNumberIsAnErrorNotAPanic(t *testing.T) {
	for _, opts := range []gather.Options{{}, {Inline: true}} {
		g := gather.New(func(context.Context, time.Time, bool, []int) ([]int, error) { return nil, nil }, opts)
		if _, err := g.Do(context.Background(), 1); err == nil {
			t.Errorf("%+v: a flush answering no response for one request gave no error", opts)
		}
	}
}

func TestALoneInlineCallAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are the race detector's under -race")
	}
	resps := []int{0}
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
		resps[0] = 2 * reqs[0]
		return resps, nil
	}
	g := gather.New(flush, gather.Options{MaxWait: time.Hour, Inline: true})
	if n := testing.AllocsPerRun(100, func() {
		if resp, err := g.Do(context.Background(), 1); resp != 2 || err != nil {
			t.Fatalf("Do = %d, %v", resp, err)
		}
	}); n != 0 {
		t.Errorf("a lone inline call makes %v allocations, want 0: its batch and requests array are kept for the next", n)
	}
}

func BenchmarkGather(b *testing.B) {
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
		out := make([]int, len(reqs))
		copy(out, reqs)
		return out, nil
	}
	for _, inline := range []bool{false, true} {
		for _, par := range []int{1, 16} {
			b.Run(fmt.Sprintf("inline=%v/parallelism=%d", inline, par), func(b *testing.B) {
				g := gather.New(flush, gather.Options{MaxWait: time.Millisecond, Inline: inline})
				b.SetParallelism(par)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if _, err := g.Do(context.Background(), 1); err != nil {
							b.Error(err)
						}
					}
				})
			})
		}
	}
}

// callerKey marks a caller's context, so that a Flush can tell whose context it got.
type callerKey struct{}

// ctxGate is a gate that also records, for every batch, the caller mark of the context
// its Flush got (0 for none: the Gatherer's own context.Background()) and its inline
// flag.
type ctxGate struct {
	gate
	marks   []int  // guarded by gate.mu
	inlines []bool // guarded by gate.mu
}

func (g *ctxGate) flush(ctx context.Context, by time.Time, inline bool, reqs []int) ([]int, error) {
	mark, _ := ctx.Value(callerKey{}).(int)
	g.mu.Lock()
	g.marks = append(g.marks, mark)
	g.inlines = append(g.inlines, inline)
	g.mu.Unlock()
	return g.gate.flush(ctx, by, inline, reqs)
}

func marked(n int) context.Context { return context.WithValue(context.Background(), callerKey{}, n) }

func TestInlineRunsALoneCallUnderItsCallersContextAndBatchesUnderNone(t *testing.T) {
	for _, inline := range []bool{false, true} {
		f := &ctxGate{gate: gate{started: make(chan []int, 10), release: make(chan struct{})}}
		g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: inline})
		lone := await(marked(1), g, 1)
		<-f.started
		var waiting []<-chan answer // join the pending batch while the lane is busy
		for i := range 5 {
			waiting = append(waiting, await(marked(10+i), g, 10+i))
		}
		gather.WaitPending(t, g, 5)
		f.release <- struct{}{}
		if a := <-lone; a.resp != 2 || a.err != nil {
			t.Errorf("inline %v: the lone call = %+v", inline, a)
		}
		select {
		case b := <-f.started:
			if len(b) != 5 {
				t.Errorf("inline %v: the batch gathered meanwhile holds %v, want all 5 calls", inline, b)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("inline %v: the batch gathered meanwhile was not sent when the lone call's lane came free", inline)
		}
		close(f.release)
		for _, ch := range waiting {
			if a := <-ch; a.err != nil || a.resp < 20 {
				t.Errorf("inline %v: a batched call = %+v", inline, a)
			}
		}
		// The lane is free again: the next lone call runs as the first did.
		gather.WaitFree(t, g, 1)
		if resp, err := g.Do(marked(2), 3); resp != 6 || err != nil {
			t.Errorf("inline %v: Do after the batch = %d, %v", inline, resp, err)
		}
		want, wantInline := []int{0, 0, 0}, []bool{false, false, false}
		if inline {
			want, wantInline = []int{1, 0, 2}, []bool{true, false, true}
		}
		if fmt.Sprint(f.marks) != fmt.Sprint(want) {
			t.Errorf("inline %v: the flushes got the contexts of callers %v, want %v (0: none)", inline, f.marks, want)
		}
		if fmt.Sprint(f.inlines) != fmt.Sprint(wantInline) {
			t.Errorf("inline %v: the flushes were told inline %v, want %v", inline, f.inlines, wantInline)
		}
	}
}

func TestInlineFreesTheLaneWhenFlushPanics(t *testing.T) {
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
		if reqs[0] < 0 {
			panic("flush failed")
		}
		return append([]int(nil), reqs...), nil
	}
	g := gather.New(flush, gather.Options{MaxWait: time.Hour, Inline: true})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic of an inline flush did not reach its caller")
			}
		}()
		g.Do(context.Background(), -1)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if resp, err := g.Do(ctx, 4); resp != 4 || err != nil {
		t.Errorf("Do after a panicking inline flush = %d, %v; want the lane free again", resp, err)
	}
}

// goroutineID is the id of the calling goroutine, from the first line of its stack.
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := bytes.Cut(bytes.TrimPrefix(buf, []byte("goroutine ")), []byte(" "))
	return string(id)
}

func TestBatchesRunOnAWorkerThatOutlivesThemAndEndsWhenIdle(t *testing.T) {
	before := runtime.NumGoroutine()
	var mu sync.Mutex
	ran := map[string]int{} // goroutine id -> batches it ran
	flush := func(_ context.Context, _ time.Time, _ bool, reqs []int) ([]int, error) {
		mu.Lock()
		ran[goroutineID()]++
		mu.Unlock()
		return slices.Clone(reqs), nil
	}
	g := gather.New(flush, gather.Options{MaxWait: time.Hour})
	// Long enough that no pause of this goroutine on a loaded machine (make test runs
	// packages beside each other) ends the worker between two batches.
	gather.SetWorkerIdle(g, 2*time.Second)
	for i := range 20 {
		if resp, err := g.Do(context.Background(), i); resp != i || err != nil {
			t.Fatalf("call %d: %d, %v", i, resp, err)
		}
		gather.WaitFree(t, g, 1)
		gather.WaitWorkersWaiting(t, 1) // the worker goes back to wait for the next
	}
	mu.Lock()
	if len(ran) != 1 {
		t.Errorf("20 batches one after another ran on %d goroutines (%v), want 1", len(ran), ran)
	}
	mu.Unlock()
	testenv.Eventually(t, 10*time.Second, fmt.Sprintf("the idle worker ending (%d goroutines before the first batch)", before),
		func() bool { return runtime.NumGoroutine() <= before })
}

// onOneThread runs f with GOMAXPROCS 1, so that the goroutines it starts run one at a
// time, in the scheduler's order, as they do on a busy machine.
func onOneThread(f func()) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
}

// mostly runs trial 20 times, and fails unless it says yes at least 15 times. A Gosched
// lets the goroutines ready to run go first, but not always. The scheduler looks at its
// global queue first one schedule in 61, and the race detector shuffles its order.
func mostly(t *testing.T, what string, trial func() (bool, string)) {
	t.Helper()
	yes, last := 0, ""
	for range 20 {
		ok, got := trial()
		if ok {
			yes++
		} else {
			last = got
		}
	}
	if yes < 15 {
		t.Errorf("%s in %d of 20 trials, want at least 15; the last other: %s", what, yes, last)
	}
}

func TestCallsReadyToRunJoinTheBatchTheFirstOfThemOpens(t *testing.T) {
	// Ten callers made ready at once, as the answer of a round trip or a netpoll makes
	// them. The first finds the lane free. Without its Gosched, it would go alone, and
	// the other nine a round trip later.
	for _, inline := range []bool{false, true} {
		mostly(t, fmt.Sprintf("inline %v: the first of ten callers ready at once took others into its batch", inline), func() (bool, string) {
			f := &gate{}
			g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: inline})
			var answers []answer
			onOneThread(func() {
				var chs []<-chan answer
				for i := range 10 {
					chs = append(chs, await(context.Background(), g, i))
				}
				for _, ch := range chs {
					answers = append(answers, <-ch)
				}
			})
			for i, a := range answers {
				if a.resp != 2*i || a.err != nil {
					t.Errorf("inline %v: call %d = %+v", inline, i, a)
				}
			}
			// All ten, unless another goroutine runs first (the race detector's, a
			// timer's), and the first caller's turn comes back before all have joined.
			return len(f.batches[0]) > 1, fmt.Sprint(f.batches)
		})
	}
}

func TestACallerAnsweredJoinsTheNextBatchBeforeItGoes(t *testing.T) {
	// A closed loop: a caller calls again once answered. While its first round is in
	// flight, a second caller waits in the next batch. When the round returns, the
	// lane lets the first caller run before it takes the next batch. So its call
	// joins. Run inline, the first round hands its lane to a worker. The worker takes
	// the batch when it starts, after the caller has gone on.
	for _, inline := range []bool{false, true} {
		mostly(t, fmt.Sprintf("inline %v: the answered caller's next call joined the batch gathered meanwhile", inline), func() (bool, string) {
			return answeredJoins(t, inline)
		})
	}
}

// answeredJoins is one trial of TestACallerAnsweredJoinsTheNextBatchBeforeItGoes.
func answeredJoins(t *testing.T, inline bool) (bool, string) {
	f := &gate{started: make(chan []int, 10), release: make(chan struct{})}
	g := gather.New(f.flush, gather.Options{MaxWait: time.Hour, Inline: inline})
	var second, again <-chan answer
	onOneThread(func() {
		loop := make(chan answer, 1)
		go func() {
			if resp, err := g.Do(context.Background(), 1); resp != 2 || err != nil {
				t.Errorf("first call = %d, %v", resp, err)
			}
			resp, err := g.Do(context.Background(), 3)
			loop <- answer{resp, err}
		}()
		again = loop
		<-f.started
		second = await(context.Background(), g, 2)
		for !gather.Pending(g, 1) {
			runtime.Gosched()
		}
		close(f.release)
	})
	if a := <-second; a.resp != 4 || a.err != nil {
		t.Errorf("second call = %+v", a)
	}
	if a := <-again; a.resp != 6 || a.err != nil {
		t.Errorf("the first caller's next call = %+v", a)
	}
	return fmt.Sprint(f.batches) == "[[1] [2 3]]", fmt.Sprint(f.batches)
}
