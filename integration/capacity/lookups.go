package capacity

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/keystore"
)

// Lookups describes a measurement of key lookups: Runner's workers, each one
// keystore.Batcher over a pool of its own as a gateway process has, verify random keys
// of Seed's among Keys.
type Lookups struct {
	// DatabaseURL is the workers' (through PgBouncer, say); ProbeURL reaches the
	// PostgreSQL server itself, for its CPU and statistics (default: DatabaseURL).
	DatabaseURL, ProbeURL string
	// PgBouncerPID, if not 0, is a PgBouncer between them, whose CPU is measured too.
	PgBouncerPID int
	Keys         int
	// Lanes and Timeout are the Batcher's (lookup_lanes, database_timeout).
	Lanes   int
	Timeout time.Duration
	// StandbyURL, if set, is a hot standby of the PostgreSQL on this machine. The
	// workers then look keys up through a keystore.Reader on it, as a gateway with
	// database_read_urls does, and its CPU is measured beside the primary's.
	StandbyURL string
}

// Run runs one level of r per entry of waiters.
func (l Lookups) Run(ctx context.Context, r Runner, waiters []int) ([]Level, error) {
	probeURL := l.ProbeURL
	if probeURL == "" {
		probeURL = l.DatabaseURL
	}
	conn, err := pgx.Connect(ctx, probeURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgres: %w", err)
	}
	defer conn.Close(ctx)
	pg, err := benchcpu.Postgres(conn)
	if err != nil {
		return nil, err
	}
	m := meters{probes: []benchcpu.Probe{pg}, counters: func(ctx context.Context) ([]float64, error) {
		return blocks(ctx, conn)
	}}
	if l.PgBouncerPID != 0 {
		m.probes = append(m.probes, benchcpu.Process(l.PgBouncerPID, "pgbouncer-µs/op"))
	}
	args := []string{"-database-url", l.DatabaseURL, "-keys", fmt.Sprint(l.Keys),
		"-lanes", fmt.Sprint(l.Lanes), "-timeout", l.Timeout.String()}
	if l.StandbyURL != "" {
		standby, err := pgx.Connect(ctx, l.StandbyURL)
		if err != nil {
			return nil, fmt.Errorf("connecting to the standby: %w", err)
		}
		defer standby.Close(ctx)
		sb, err := benchcpu.Postgres(standby)
		if err != nil {
			return nil, err
		}
		m.probes = append(m.probes, benchcpu.Probe{Unit: "standby-µs/op", Read: sb.Read})
		if err := caughtUp(ctx, conn, standby); err != nil {
			return nil, err
		}
		args = append(args, "-standby-url", l.StandbyURL)
	}
	var out []Level
	for _, w := range waiters {
		lv, err := r.level(ctx, "lookups", args, w, m)
		if err != nil {
			return out, err
		}
		out = append(out, lv)
	}
	return out, nil
}

// caughtUp waits until standby has replayed what primary had written when it was
// called: the seeding's rows, so that the Reader's standby takes the lookups from the
// first level on.
func caughtUp(ctx context.Context, primary, standby *pgx.Conn) error {
	var target int64
	if err := primary.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0')::int8`).Scan(&target); err != nil {
		return fmt.Errorf("reading the primary's WAL position: %w", err)
	}
	for deadline := time.Now().Add(5 * time.Minute); ; {
		var replayed *int64
		if err := standby.QueryRow(ctx, `SELECT (pg_last_wal_replay_lsn() - '0/0')::int8`).Scan(&replayed); err != nil {
			return fmt.Errorf("reading the standby's replay position: %w", err)
		}
		if replayed == nil {
			return fmt.Errorf("-standby-url is not a standby")
		}
		if *replayed >= target {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the standby did not catch up with the seeding within 5 minutes")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// blocks reads the database's shared-buffer hits and reads (blocks found in
// PostgreSQL's shared buffers, and blocks it had to ask the kernel for).
func blocks(ctx context.Context, conn *pgx.Conn) ([]float64, error) {
	var hit, read float64
	err := conn.QueryRow(ctx, `SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()`).
		Scan(&hit, &read)
	if err != nil {
		return nil, fmt.Errorf("reading pg_stat_database: %w", err)
	}
	return []float64{hit, read}, nil
}

// lookupWorker is a worker of Lookups: it parses its flags from args and serves.
func lookupWorker(ctx context.Context, args []string, in io.Reader, out io.Writer) error {
	fs := flag.NewFlagSet("worker lookups", flag.ContinueOnError)
	url := fs.String("database-url", "", "the database")
	keys := fs.Int("keys", 0, "how many keys Seed made")
	lanes := fs.Int("lanes", 1, "the Batcher's lanes")
	timeout := fs.Duration("timeout", 2*time.Second, "the Batcher's timeout")
	waiters := fs.Int("waiters", 1, "goroutines verifying keys")
	standbyURL := fs.String("standby-url", "", "a hot standby to look keys up on, through a keystore.Reader")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *keys <= 0 {
		return fmt.Errorf("-keys must be positive")
	}
	cfg, err := pgxpool.ParseConfig(*url)
	if err != nil {
		return fmt.Errorf("parsing the database URL: %w", err)
	}
	// As the gateway's pool: every lookup statement prepared on each new connection.
	cfg.AfterConnect = keystore.PrepareLookups
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("connecting to postgres: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("connecting to postgres: %w", err)
	}
	format, err := keystore.NewFormat(KeyPrefix)
	if err != nil {
		return err
	}
	var batches, ids atomic.Uint64
	b := keystore.NewBatcher(keystore.New(pool, format), keystore.BatcherOptions{
		Lanes:   *lanes,
		Timeout: *timeout,
		OnBatch: func(size int) {
			batches.Add(1)
			ids.Add(uint64(size))
		},
	})
	var v interface {
		Verify(ctx context.Context, presented string) (keystore.Key, bool, error)
	} = b
	if *standbyURL != "" {
		scfg, err := pgxpool.ParseConfig(*standbyURL)
		if err != nil {
			return fmt.Errorf("parsing the standby's URL: %w", err)
		}
		scfg.AfterConnect = keystore.PrepareLookups
		standby, err := pgxpool.NewWithConfig(ctx, scfg)
		if err != nil {
			return fmt.Errorf("connecting to the standby: %w", err)
		}
		defer standby.Close()
		r := keystore.NewReader(b, pool, []*pgxpool.Pool{standby}, keystore.ReaderOptions{
			Batcher: keystore.BatcherOptions{Lanes: *lanes, Timeout: *timeout, OnBatch: func(size int) {
				batches.Add(1)
				ids.Add(uint64(size))
			}},
		})
		defer r.Close()
		v = r
	}
	n := *keys
	verify := func(ctx context.Context, rng *rand.Rand) error {
		i := rng.IntN(n)
		k, ok, err := v.Verify(ctx, FullKey(i))
		if err != nil {
			return err
		}
		if !ok || k.ID != KeyID(i) {
			return errRejected
		}
		return nil
	}
	rounds := func() (uint64, uint64) { return batches.Load(), ids.Load() }
	return serve(ctx, *waiters, verify, rounds, in, out)
}
