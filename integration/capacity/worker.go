package capacity

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"sync"
	"time"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
)

// An op is one operation of a worker's load, on a key it picks with rng. It returns
// errRejected when a seeded key was refused (the seeding is wrong), another error when
// the operation failed.
type op func(ctx context.Context, rng *rand.Rand) error

var errRejected = errors.New("a seeded key was refused")

// roundCounter reports how many round trips a worker's client made so far, and how
// many operations they carried: batch queries and their distinct key ids, or Redis
// round trips and their script calls.
type roundCounter func() (rounds, items uint64)

// workerReport is what one worker did between "go" and "stop".
type workerReport struct {
	Ops, Errors, Rejected uint64
	Rounds, Items         uint64
	CPU                   time.Duration // the worker process's own
	Latency               []uint64      // a latency histogram's counts
	Error                 string        `json:",omitempty"` // the first error, to tell what failed
}

// tally is what a worker's operations have done since it started. Its mutex keeps a
// snapshot's counts and latencies consistent with each other; it is held for a few
// additions per operation.
type tally struct {
	mu                    sync.Mutex
	ops, errors, rejected uint64
	latency               latency
	firstErr              string
}

func (t *tally) done(err error, took time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.latency.add(took)
	t.ops++
	switch {
	case err == nil:
	case errors.Is(err, errRejected):
		t.rejected++
	default:
		t.errors++
		if t.firstErr == "" {
			t.firstErr = err.Error()
		}
	}
}

// serve is a worker's life: waiters goroutines call do in a loop from the start (the
// warm-up); serve writes "ready" to out, and reports to out, as one JSON line, what
// they did between the lines "go" and "stop" it reads from in. It returns once the
// operations in flight have ended.
func serve(ctx context.Context, waiters int, do op, rounds roundCounter, in io.Reader, out io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var t tally
	var wg sync.WaitGroup
	seed := uint64(time.Now().UnixNano()) ^ uint64(os.Getpid())<<32
	for w := range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for ctx.Err() == nil {
				start := time.Now()
				err := do(ctx, rng)
				if ctx.Err() == nil {
					t.done(err, time.Since(start))
				}
			}
		}()
	}
	defer wg.Wait()
	if _, err := fmt.Fprintln(out, "ready"); err != nil {
		return err
	}
	lines := bufio.NewScanner(in)
	if err := expect(lines, "go"); err != nil {
		return err
	}
	before, err := t.report(rounds)
	if err != nil {
		return err
	}
	if err := expect(lines, "stop"); err != nil {
		return err
	}
	after, err := t.report(rounds)
	if err != nil {
		return err
	}
	cancel()
	after.Ops -= before.Ops
	after.Errors -= before.Errors
	after.Rejected -= before.Rejected
	after.Rounds -= before.Rounds
	after.Items -= before.Items
	after.CPU -= before.CPU
	after.Latency = sub(after.Latency, before.Latency)
	return json.NewEncoder(out).Encode(after)
}

// report is the tally so far, with the process's CPU time and its rounds.
func (t *tally) report(rounds roundCounter) (workerReport, error) {
	cpu, err := benchcpu.Self().Read()
	if err != nil {
		return workerReport{}, err
	}
	t.mu.Lock()
	r := workerReport{Ops: t.ops, Errors: t.errors, Rejected: t.rejected, CPU: cpu,
		Latency: t.latency.snapshot(), Error: t.firstErr}
	t.mu.Unlock()
	r.Rounds, r.Items = rounds()
	return r, nil
}

// expect reads the next line and fails unless it is word.
func expect(lines *bufio.Scanner, word string) error {
	if !lines.Scan() {
		if err := lines.Err(); err != nil {
			return err
		}
		return fmt.Errorf("waiting for %q: end of input", word)
	}
	if got := lines.Text(); got != word {
		return fmt.Errorf("waiting for %q: got %q", word, got)
	}
	return nil
}
