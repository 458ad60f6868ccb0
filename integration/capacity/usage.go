package capacity

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/benchcpu"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema"
	"github.com/keygate/keygate/upstream/store"
)

// UsageWrites describes a measurement of the usage record on PostgreSQL: what a row
// of usage_minutes costs to write and to roll up, and what the month re-seed's read
// costs. At each of Sizes, one keystore.Usage, as a gateway process has, records one
// request of each of N keys (Seed's key ids, key i in org i mod Orgs) in one minute
// and flushes them: N new rows; then the same rows again, as a second gateway process
// that saw the same keys would: N rows added to; then the upstream's roll-up adds them
// to their hours and days, which earlier minutes of the same keys made (the steady
// state of keys in use every minute). It repeats this minute after minute until it
// has written at least PerSize rows and done it twice. Then it reads the month of
// orgs that have rows (at most maxMonthReads), one after the other, as a gateway does
// to re-seed a month Redis lost: each of an org's keys has a day row.
type UsageWrites struct {
	// DatabaseURL is a database of its own: it is created and migrated when missing,
	// and its usage tables are emptied first.
	DatabaseURL string
	Orgs        int
	Sizes       []int
	PerSize     int
}

// UsageRows is what the usage record's writes of one size cost.
type UsageRows struct {
	Rows, Minutes int
	// New, Added and RolledUp are PostgreSQL's CPU time, in all, for the flushes of
	// new rows, the flushes adding to them and the roll-ups; Wall the three's time.
	New, Added, RolledUp time.Duration
	Wall                 time.Duration
	// Reads is how many month reads, one per org, DayRows the day rows each org had
	// in usage_days on average, and Read their PostgreSQL CPU time in all.
	Reads   int
	DayRows float64
	Read    time.Duration
}

// Run measures every size of w in turn, each in a month of its own, in the past.
func (w UsageWrites) Run(ctx context.Context) ([]UsageRows, error) {
	if w.Orgs <= 0 || w.PerSize <= 0 {
		return nil, fmt.Errorf("orgs and rows per size must be positive")
	}
	if err := createDatabase(ctx, w.DatabaseURL); err != nil {
		return nil, err
	}
	if err := schema.Migrate(ctx, w.DatabaseURL); err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, w.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("connecting to postgres: %w", err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `TRUNCATE usage_minutes, usage_hours, usage_days, usage_flushes`); err != nil {
		return nil, fmt.Errorf("emptying the usage tables: %w", err)
	}
	pg, err := benchcpu.Postgres(pool)
	if err != nil {
		return nil, err
	}
	st := store.New(pool)
	var out []UsageRows
	for s, n := range w.Sizes {
		if n <= 0 {
			return out, fmt.Errorf("%d rows a flush", n)
		}
		// Each size in a month of its own, so that the month reads of one size see
		// its day rows alone; minute 0 makes the hour and day rows the others add to.
		now := time.Now().UTC()
		month := time.Date(now.Year(), now.Month()-time.Month(1+s), 1, 0, 0, 0, 0, time.UTC)
		r := UsageRows{Rows: n}
		flush := func(minute int, into *time.Duration) error {
			u := keystore.NewUsage(pool, keystore.UsageOptions{MaxPending: n})
			at := month.Add(time.Duration(minute) * time.Minute)
			for i := range n {
				u.Record(OrgID(i%w.Orgs), KeyID(i), at, keystore.OutcomeProxied, 200, 1)
			}
			return measured(pg, into, func() error { return u.Flush(ctx) })
		}
		rollUp := func(into *time.Duration) error {
			return measured(pg, into, func() error {
				rolled, err := st.RollUpUsage(ctx)
				if err == nil && rolled != int64(n) {
					err = fmt.Errorf("rolled up %d minute rows, want %d", rolled, n)
				}
				return err
			})
		}
		var warm time.Duration
		if err := flush(0, &warm); err != nil {
			return out, err
		}
		if err := rollUp(&warm); err != nil {
			return out, err
		}
		start := time.Now()
		for r.Minutes < 2 || r.Minutes*n < w.PerSize {
			r.Minutes++
			if err := flush(r.Minutes, &r.New); err != nil {
				return out, err
			}
			if err := flush(r.Minutes, &r.Added); err != nil {
				return out, err
			}
			if err := rollUp(&r.RolledUp); err != nil {
				return out, err
			}
		}
		r.Wall = time.Since(start)
		// The reads after a vacuum, as autovacuum would have made one after so many
		// writes, rather than during them.
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE usage_minutes, usage_hours, usage_days`); err != nil {
			return out, fmt.Errorf("vacuuming: %w", err)
		}
		r.Reads = min(n, w.Orgs, maxMonthReads)
		r.DayRows = float64(n) / float64(min(n, w.Orgs))
		reader := keystore.NewUsage(pool, keystore.UsageOptions{}) // as the gateway's, with nothing pending
		err := measured(pg, &r.Read, func() error {
			for o := range r.Reads {
				used, err := reader.MonthUsed(ctx, OrgID(o), month)
				if err != nil {
					return err
				}
				if used == 0 {
					return fmt.Errorf("org %s: the month read found nothing", OrgID(o))
				}
			}
			return nil
		})
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// maxMonthReads is how many orgs' months a size reads at most.
const maxMonthReads = 2000

// measured runs do and adds PostgreSQL's CPU time meanwhile to *into.
func measured(pg benchcpu.Probe, into *time.Duration, do func() error) error {
	before, err := pg.Read()
	if err != nil {
		return err
	}
	if err := do(); err != nil {
		return err
	}
	after, err := pg.Read()
	if err != nil {
		return err
	}
	*into += after - before
	return nil
}
