package capacity

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/keygate/keygate/internal/benchcpu"
	"github.com/keygate/keygate/limiter"
)

// Counts describes a measurement of rate-limit counts: Runner's workers, each one
// limiter.Redis with pipelining over a client of its own as a gateway process has,
// count requests of random keys among Keys (Seed's key ids), against a limit no key
// reaches.
type Counts struct {
	// RedisURL is a single Redis, or with Cluster a Redis Cluster (go-redis's
	// ParseClusterURL).
	RedisURL string
	Cluster  bool
	Keys     int
	// Orgs, when positive, counts as for a plan with organisation budgets: key i
	// belongs to organisation i mod Orgs (OrgID), and each count is of the key's
	// minute, the org's minute and the org's month, none of which any org reaches.
	// Zero counts the key's minute alone, as for a plan without them.
	Orgs int
	// Timeout is the limiter's and the client's (redis_timeout).
	Timeout time.Duration
}

// Run runs one level of c per entry of waiters. Each level's Servers hold each
// primary's CPU time, and its Counters each primary's script calls (EVALSHA and
// EVAL), in the order of c.Primaries.
func (c Counts) Run(ctx context.Context, r Runner, waiters []int) ([]Level, error) {
	primaries, err := c.Primaries(ctx)
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, p := range primaries {
			p.Close()
		}
	}()
	var m meters
	for _, p := range primaries {
		m.probes = append(m.probes, benchcpu.Redis(p))
	}
	m.counters = func(ctx context.Context) ([]float64, error) {
		var calls []float64
		for _, p := range primaries {
			info, err := p.Info(ctx, "commandstats").Result()
			if err != nil {
				return nil, fmt.Errorf("INFO commandstats: %w", err)
			}
			calls = append(calls, scriptCalls(info))
		}
		return calls, nil
	}
	args := []string{"-redis-url", c.RedisURL, "-keys", fmt.Sprint(c.Keys), "-timeout", c.Timeout.String(),
		"-orgs", fmt.Sprint(c.Orgs)}
	if c.Cluster {
		args = append(args, "-cluster")
	}
	var out []Level
	for _, w := range waiters {
		lv, err := r.level(ctx, "counts", args, w, m)
		if err != nil {
			return out, err
		}
		out = append(out, lv)
	}
	return out, nil
}

// Primaries returns a client of each primary: the single Redis, or each master of
// the Cluster, sorted by address.
func (c Counts) Primaries(ctx context.Context) ([]*redis.Client, error) {
	if !c.Cluster {
		opt, err := redis.ParseURL(c.RedisURL)
		if err != nil {
			return nil, fmt.Errorf("parsing the Redis URL: %w", err)
		}
		return []*redis.Client{redis.NewClient(opt)}, nil
	}
	opt, err := redis.ParseClusterURL(c.RedisURL)
	if err != nil {
		return nil, fmt.Errorf("parsing the Redis Cluster URL: %w", err)
	}
	cc := redis.NewClusterClient(opt)
	defer cc.Close()
	var (
		mu    sync.Mutex
		addrs []string
	)
	err = cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		mu.Lock()
		defer mu.Unlock()
		addrs = append(addrs, m.Options().Addr)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the Cluster's masters: %w", err)
	}
	slices.Sort(addrs)
	var out []*redis.Client
	for _, a := range addrs {
		out = append(out, redis.NewClient(&redis.Options{Addr: a, Username: opt.Username, Password: opt.Password,
			TLSConfig: opt.TLSConfig}))
	}
	return out, nil
}

// scriptCalls reads the calls of EVALSHA and EVAL from an INFO commandstats answer
// (lines such as "cmdstat_evalsha:calls=12,usec=34,…").
func scriptCalls(info string) float64 {
	var total float64
	for line := range strings.Lines(info) {
		name, stats, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		for field := range strings.SplitSeq(stats, ",") {
			if v, ok := strings.CutPrefix(field, "calls="); ok {
				n, _ := strconv.ParseFloat(v, 64)
				total += n
			}
		}
	}
	return total
}

// roundHook counts the round trips of a client's script calls: each pipeline one,
// with as many calls as it holds, and each call sent alone one. On a Cluster it is
// added to every node's client, whose pipelines are those the cluster client splits
// its own into, one per node.
type roundHook struct{ rounds, calls atomic.Uint64 }

func (h *roundHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			h.rounds.Add(1)
			h.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *roundHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.rounds.Add(1)
		h.calls.Add(uint64(len(cmds)))
		return next(ctx, cmds)
	}
}

// countWorker is a worker of Counts: it parses its flags from args and serves.
func countWorker(ctx context.Context, args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("worker counts", flag.ContinueOnError)
	url := fs.String("redis-url", "", "the Redis")
	cluster := fs.Bool("cluster", false, "the Redis is a Cluster")
	keys := fs.Int("keys", 0, "how many key ids to count")
	timeout := fs.Duration("timeout", 200*time.Millisecond, "the limiter's and the client's timeout")
	waiters := fs.Int("waiters", 1, "goroutines counting")
	orgs := fs.Int("orgs", 0, "count with organisation budgets, the keys spread over this many orgs (0: the key's minute alone)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keys <= 0 || *orgs < 0 {
		return fmt.Errorf("-keys must be positive, -orgs at least 0")
	}
	var h roundHook
	client, err := countClient(*url, *cluster, *timeout, &h)
	if err != nil {
		return err
	}
	defer client.Close()
	lim := limiter.NewRedis(client, limiter.WithTimeout(*timeout), limiter.WithPipelining(*timeout))
	if err := lim.Prepare(ctx); err != nil {
		return err
	}
	n, o := *keys, *orgs
	count := func(ctx context.Context, rng *rand.Rand) error {
		_, err := lim.Allow(ctx, limiter.Budgets{Key: KeyID(rng.IntN(n)), KeyLimit: 1 << 30})
		return err
	}
	if o > 0 {
		count = func(ctx context.Context, rng *rand.Rand) error {
			i := rng.IntN(n)
			_, err := lim.Allow(ctx, limiter.Budgets{Key: KeyID(i), KeyLimit: 1 << 30,
				Org: OrgID(i % o), OrgLimit: 1 << 30, MonthLimit: 1 << 50})
			return err
		}
	}
	rounds := func() (uint64, uint64) { return h.rounds.Load(), h.calls.Load() }
	return serve(ctx, *waiters, count, rounds, in, out)
}

// countClient builds a client with the gateway's limits (caddymodule's
// newRedisClient): timeout on every part of a command, no retries.
func countClient(url string, cluster bool, timeout time.Duration, h *roundHook) (redis.UniversalClient, error) {
	if !cluster {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return nil, fmt.Errorf("parsing the Redis URL: %w", err)
		}
		opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = timeout, timeout, timeout
		opt.ContextTimeoutEnabled, opt.MaxRetries = true, -1
		c := redis.NewClient(opt)
		c.AddHook(h)
		return c, nil
	}
	opt, err := redis.ParseClusterURL(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the Redis Cluster URL: %w", err)
	}
	opt.ReadTimeout, opt.WriteTimeout, opt.PoolTimeout = timeout, timeout, timeout
	opt.ContextTimeoutEnabled, opt.MaxRetries = true, -1
	c := redis.NewClusterClient(opt)
	c.OnNewNode(func(node *redis.Client) { node.AddHook(h) })
	return c, nil
}
