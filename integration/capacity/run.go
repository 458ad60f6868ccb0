package capacity

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"time"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
)

// A Runner runs one level of load: Procs worker processes, each running Command with
// "worker", the kind of load, its arguments and "-waiters N", for Warmup and then
// Duration, while it measures the servers.
type Runner struct {
	// Command runs this program; Env is added to the workers' environment.
	Command []string
	Env     []string
	// Procs is the number of worker processes, each one gateway's worth of clients.
	Procs            int
	Warmup, Duration time.Duration
}

// meters are what a level measures around its window: the servers' CPU time, one
// probe each, and counters of the servers (blocks read, commands run) whose growth
// the report uses.
type meters struct {
	probes   []benchcpu.Probe
	counters func(ctx context.Context) ([]float64, error) // may be nil
}

// Level is what one level of load did in its window.
type Level struct {
	Procs, Waiters int
	// Wall is the window, from "go" to "stop".
	Wall time.Duration
	// Ops, Errors and Rejected sum the workers' operations; Rounds and Items their
	// round trips and the operations those carried (see roundCounter).
	Ops, Errors, Rejected, Rounds, Items uint64
	// Client is the workers' CPU time, Servers each probe's, Counters the growth of
	// the meters' counters.
	Client   time.Duration
	Servers  []time.Duration
	Counters []float64
	// Latency counts the operations by how long each took (see latency).
	Latency []uint64
	// Error is a worker's first error, if any.
	Error string
}

// level runs kind with args and waiters goroutines in each of r.Procs workers and
// measures m around the window.
func (r Runner) level(ctx context.Context, kind string, args []string, waiters int, m meters) (Level, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lv := Level{Procs: r.Procs, Waiters: waiters, Latency: make([]uint64, latencyBuckets)}
	var workers []*worker
	defer func() {
		for _, w := range workers {
			w.stop()
		}
	}()
	argv := append([]string{"worker", kind}, args...)
	argv = append(argv, "-waiters", strconv.Itoa(waiters))
	for range r.Procs {
		w, err := startWorker(ctx, r.Command, r.Env, argv)
		if err != nil {
			return Level{}, err
		}
		workers = append(workers, w)
	}
	for _, w := range workers {
		if err := w.await("ready", 30*time.Second); err != nil {
			return Level{}, err
		}
	}
	time.Sleep(r.Warmup)
	before, beforeCounters, err := read(ctx, m)
	if err != nil {
		return Level{}, err
	}
	start := time.Now()
	if err := tell(workers, "go"); err != nil {
		return Level{}, err
	}
	time.Sleep(r.Duration)
	after, afterCounters, err := read(ctx, m)
	if err != nil {
		return Level{}, err
	}
	lv.Wall = time.Since(start)
	if err := tell(workers, "stop"); err != nil {
		return Level{}, err
	}
	for i := range before {
		lv.Servers = append(lv.Servers, after[i]-before[i])
	}
	for i := range beforeCounters {
		lv.Counters = append(lv.Counters, afterCounters[i]-beforeCounters[i])
	}
	for _, w := range workers {
		rep, err := w.report(30 * time.Second)
		if err != nil {
			return Level{}, err
		}
		lv.Ops += rep.Ops
		lv.Errors += rep.Errors
		lv.Rejected += rep.Rejected
		lv.Rounds += rep.Rounds
		lv.Items += rep.Items
		lv.Client += rep.CPU
		addTo(lv.Latency, rep.Latency)
		if lv.Error == "" {
			lv.Error = rep.Error
		}
	}
	return lv, nil
}

// read reads every probe and the counters.
func read(ctx context.Context, m meters) ([]time.Duration, []float64, error) {
	var cpu []time.Duration
	for _, p := range m.probes {
		d, err := p.Read()
		if err != nil {
			return nil, nil, fmt.Errorf("reading %s: %w", p.Unit, err)
		}
		cpu = append(cpu, d)
	}
	if m.counters == nil {
		return cpu, nil, nil
	}
	c, err := m.counters(ctx)
	return cpu, c, err
}

// worker is one worker process, spoken to through its stdin and stdout.
type worker struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines *bufio.Scanner
	done  chan struct{} // closed when cmd has exited
}

func startWorker(ctx context.Context, command, env, argv []string) (*worker, error) {
	cmd := exec.CommandContext(ctx, command[0], append(command[1:len(command):len(command)], argv...)...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting a worker: %w", err)
	}
	w := &worker{cmd: cmd, in: in, lines: bufio.NewScanner(out), done: make(chan struct{})}
	w.lines.Buffer(make([]byte, 64<<10), 1<<20)
	return w, nil
}

// next returns the worker's next line of output, or fails after timeout.
func (w *worker) next(timeout time.Duration) (string, error) {
	type line struct {
		text string
		ok   bool
	}
	got := make(chan line, 1)
	go func() {
		ok := w.lines.Scan()
		got <- line{w.lines.Text(), ok}
	}()
	select {
	case l := <-got:
		if !l.ok {
			return "", fmt.Errorf("worker %d ended early (see its errors above): %v", w.cmd.Process.Pid, w.lines.Err())
		}
		return l.text, nil
	case <-time.After(timeout):
		return "", fmt.Errorf("worker %d said nothing for %v", w.cmd.Process.Pid, timeout)
	}
}

func (w *worker) await(word string, timeout time.Duration) error {
	got, err := w.next(timeout)
	if err == nil && got != word {
		err = fmt.Errorf("worker %d said %q, not %q", w.cmd.Process.Pid, got, word)
	}
	return err
}

func (w *worker) report(timeout time.Duration) (workerReport, error) {
	got, err := w.next(timeout)
	if err != nil {
		return workerReport{}, err
	}
	var rep workerReport
	if err := json.Unmarshal([]byte(got), &rep); err != nil {
		return workerReport{}, fmt.Errorf("worker %d's report: %w", w.cmd.Process.Pid, err)
	}
	return rep, nil
}

// stop closes the worker's input and waits for it to end, killing it after a few
// seconds.
func (w *worker) stop() {
	w.in.Close()
	go func() {
		w.cmd.Wait()
		close(w.done)
	}()
	select {
	case <-w.done:
	case <-time.After(5 * time.Second):
		w.cmd.Process.Kill()
		<-w.done
	}
}

// tell writes word to every worker.
func tell(workers []*worker, word string) error {
	for _, w := range workers {
		if _, err := fmt.Fprintln(w.in, word); err != nil {
			return fmt.Errorf("telling worker %d %q: %w", w.cmd.Process.Pid, word, err)
		}
	}
	return nil
}
