package capacity

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// Main runs the command line of cmd/capacity: args without the program's name. A
// worker reads its orders from stdin; every command writes its report to stdout.
func Main(ctx context.Context, args []string, stdin io.Reader, stdout io.Writer) error {
	if len(args) == 0 {
		return errors.New("usage: capacity seed|keys|lookups|counts|lastused|usage [flags]")
	}
	cmd, args := args[0], args[1:]
	switch cmd {
	case "seed":
		return seedCommand(ctx, args, stdout)
	case "keys":
		return keysCommand(args, stdout)
	case "lookups":
		return lookupsCommand(ctx, args, stdout)
	case "counts":
		return countsCommand(ctx, args, stdout)
	case "lastused":
		return lastUsedCommand(ctx, args, stdout)
	case "usage":
		return usageCommand(ctx, args, stdout)
	case "worker":
		if len(args) == 0 {
			return errors.New("usage: capacity worker lookups|counts [flags]")
		}
		switch args[0] {
		case "lookups":
			return lookupWorker(ctx, args[1:], stdin, stdout)
		case "counts":
			return countWorker(ctx, args[1:], stdin, stdout)
		}
		return fmt.Errorf("unknown worker %q", args[0])
	}
	return fmt.Errorf("unknown command %q", cmd)
}

// common are the flags of every measuring command.
type common struct {
	label, title     string
	keys             int
	procs            int
	waiters          string
	warmup, duration time.Duration
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.label, "label", "", "the report's label, such as (p)")
	fs.StringVar(&c.title, "title", "", "what the report measures, in a few words")
	fs.IntVar(&c.keys, "keys", 1_000_000, "keys in the table (Seed's)")
	fs.IntVar(&c.procs, "procs", 4, "worker processes, each as one gateway process")
	fs.StringVar(&c.waiters, "waiters", "1,4,16,64,256", "goroutines per process at each level, comma-separated")
	fs.DurationVar(&c.warmup, "warmup", 2*time.Second, "load before each level's window")
	fs.DurationVar(&c.duration, "duration", 5*time.Second, "each level's window")
}

func (c *common) runner() (Runner, []int, error) {
	exe, err := os.Executable()
	if err != nil {
		return Runner{}, nil, err
	}
	waiters, err := positiveList("waiters", c.waiters)
	if err != nil {
		return Runner{}, nil, err
	}
	if c.procs <= 0 || c.keys <= 0 {
		return Runner{}, nil, errors.New("-procs and -keys must be positive")
	}
	return Runner{Command: []string{exe}, Procs: c.procs, Warmup: c.warmup, Duration: c.duration}, waiters, nil
}

// heading writes the report's first line: its label, its title and how it ran.
func (c *common) heading(w io.Writer, what string) {
	fmt.Fprintf(w, "%s %s: %d processes, each %s, and W goroutines per process in a closed loop;\n",
		c.label, c.title, c.procs, what)
	fmt.Fprintf(w, "    keys drawn at random among %d; %v warm-up, then %v a level\n", c.keys, c.warmup, c.duration)
}

func seedCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("seed", flag.ContinueOnError)
	url := fs.String("database-url", "", "the database to fill (created when missing)")
	keys := fs.Int("keys", 1_000_000, "keys to make")
	orgs := fs.Int("orgs", 10_000, "organisations to spread them over")
	if err := fs.Parse(args); err != nil {
		return err
	}
	s, err := Seed(ctx, *url, *keys, *orgs)
	if err != nil {
		return err
	}
	writeSeeded(stdout, s)
	return nil
}

// keysCommand prints keys of Seed as clients present them (FullKey), one a line:
// -count keys, every -every-th from key 0, so that they spread over Seed's whole
// range of ids.
func keysCommand(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("keys", flag.ContinueOnError)
	count := fs.Int("count", 2000, "keys to print")
	every := fs.Int("every", 500, "the step between their numbers")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *count <= 0 || *every <= 0 {
		return errors.New("-count and -every must be positive")
	}
	w := bufio.NewWriter(stdout)
	for i := range *count {
		fmt.Fprintln(w, FullKey(i**every))
	}
	return w.Flush()
}

func writeSeeded(w io.Writer, s Seeded) {
	took := "there already"
	if s.Took > 0 {
		took = fmt.Sprintf("seeded in %.1fs", s.Took.Seconds())
	}
	fmt.Fprintf(w, "    api_keys: %d keys of %d orgs (%s), table %.0f MB, key_id index %.0f MB, lookup index %.0f MB, "+
		"%.0f %% of pages all-visible, shared_buffers %s\n", s.Keys, s.Orgs, took, float64(s.TableBytes)/(1<<20),
		float64(s.IndexBytes)/(1<<20), float64(s.LookupIndexBytes)/(1<<20), 100*s.AllVisible, s.SharedBuffers)
}

func lookupsCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("lookups", flag.ContinueOnError)
	var c common
	c.register(fs)
	var l Lookups
	fs.StringVar(&l.DatabaseURL, "database-url", "", "the workers' database URL")
	fs.StringVar(&l.ProbeURL, "probe-url", "", "PostgreSQL itself, to seed and measure (default: -database-url)")
	fs.IntVar(&l.PgBouncerPID, "pgbouncer-pid", 0, "a PgBouncer between the workers and PostgreSQL, to measure too")
	fs.StringVar(&l.StandbyURL, "standby-url", "", "a hot standby of PostgreSQL on this machine: lookups through a keystore.Reader on it, its CPU measured too")
	fs.IntVar(&l.Lanes, "lanes", 1, "each Batcher's lanes (lookup_lanes)")
	fs.DurationVar(&l.Timeout, "timeout", 2*time.Second, "each Batcher's timeout (database_timeout)")
	orgs := fs.Int("orgs", 10_000, "organisations the keys belong to")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, waiters, err := c.runner()
	if err != nil {
		return err
	}
	l.Keys = c.keys
	seedURL := l.ProbeURL
	if seedURL == "" {
		seedURL = l.DatabaseURL
	}
	s, err := Seed(ctx, seedURL, c.keys, *orgs)
	if err != nil {
		return err
	}
	levels, err := l.Run(ctx, r, waiters)
	if err != nil {
		return err
	}
	what := fmt.Sprintf("a keystore.Batcher (%d lane) on a pool of its own", l.Lanes)
	if l.StandbyURL != "" {
		what = fmt.Sprintf("a keystore.Reader on one standby (Batchers of %d lane on pools of their own)", l.Lanes)
	}
	c.heading(stdout, what)
	writeSeeded(stdout, s)
	WriteLookups(stdout, l, levels)
	return nil
}

func countsCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("counts", flag.ContinueOnError)
	var c common
	c.register(fs)
	var cs Counts
	fs.StringVar(&cs.RedisURL, "redis-url", "", "the Redis (with -cluster, the Cluster)")
	fs.BoolVar(&cs.Cluster, "cluster", false, "the Redis is a Cluster")
	fs.DurationVar(&cs.Timeout, "timeout", 200*time.Millisecond, "the limiter's timeout (redis_timeout)")
	fs.IntVar(&cs.Orgs, "orgs", 0, "count with organisation budgets, the keys spread over this many orgs (0: the key's minute alone)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	r, waiters, err := c.runner()
	if err != nil {
		return err
	}
	if cs.Orgs < 0 {
		return errors.New("-orgs must be at least 0")
	}
	cs.Keys = c.keys
	primaries, err := cs.Primaries(ctx)
	if err != nil {
		return err
	}
	for _, p := range primaries {
		p.Close()
	}
	levels, err := cs.Run(ctx, r, waiters)
	if err != nil {
		return err
	}
	c.heading(stdout, "a limiter.Redis with pipelining on a client of its own")
	what := "every count a key's own counter, hash-tagged by its key id"
	if cs.Orgs > 0 {
		what = fmt.Sprintf("every count the budgets of a plan with an org ceiling and a monthly quota: the key's minute, "+
			"its org's minute and month in one script call, hash-tagged by the org's id; the keys spread over %d orgs", cs.Orgs)
	}
	fmt.Fprintf(stdout, "    %d primar%s; %s\n",
		len(primaries), map[bool]string{true: "y", false: "ies"}[len(primaries) == 1], what)
	WriteCounts(stdout, levels, len(primaries))
	return nil
}

func lastUsedCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("lastused", flag.ContinueOnError)
	var w LastUsedWrites
	label := fs.String("label", "", "the report's label")
	fs.StringVar(&w.DatabaseURL, "database-url", "", "a database Seed filled")
	fs.IntVar(&w.Keys, "keys", 1_000_000, "keys in the table (Seed's)")
	sizes := fs.String("sizes", "1000,10000,100000", "keys per flush, comma-separated")
	fs.IntVar(&w.PerSize, "per-size", 200_000, "keys to write at each size, at least")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if w.Sizes, err = positiveList("sizes", *sizes); err != nil {
		return err
	}
	flushes, err := w.Run(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s last_used_at writes: one keystore.LastUsed flushing N distinct keys of %d at a time, each key once\n",
		*label, w.Keys)
	WriteLastUsed(stdout, flushes)
	return nil
}

func usageCommand(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	var w UsageWrites
	label := fs.String("label", "", "the report's label")
	fs.StringVar(&w.DatabaseURL, "database-url", "", "a database of its own (created, migrated, its usage tables emptied)")
	fs.IntVar(&w.Orgs, "orgs", 10_000, "organisations the keys belong to")
	sizes := fs.String("sizes", "1000,100000", "rows per flush, comma-separated")
	fs.IntVar(&w.PerSize, "per-size", 200_000, "rows to write at each size, at least")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var err error
	if w.Sizes, err = positiveList("sizes", *sizes); err != nil {
		return err
	}
	rows, err := w.Run(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s the usage record on PostgreSQL: per minute, one keystore.Usage flushing N rows (a key, proxied, 200) new,\n", *label)
	fmt.Fprintf(stdout, "    the same N again (a second gateway's), and the upstream's roll-up of them into existing hours and days;\n")
	fmt.Fprintf(stdout, "    then month reads (the month re-seed's) of orgs with rows, at most %d; keys spread over %d orgs\n", maxMonthReads, w.Orgs)
	WriteUsage(stdout, rows)
	return nil
}

// positiveList parses the value of flag name: positive numbers, comma-separated.
func positiveList(name, value string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(value, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-%s: %q is not a positive number", name, f)
		}
		out = append(out, n)
	}
	return out, nil
}
