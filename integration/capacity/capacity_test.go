package capacity

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/keygate/keygate/internal/testkit/redistest"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/schema/schematest"
)

// TestMain makes the test binary a worker when a Runner of these tests starts it.
func TestMain(m *testing.M) {
	if os.Getenv("CAPACITY_TEST_WORKER") == "1" {
		if err := Main(context.Background(), os.Args[1:], os.Stdin, os.Stdout); err != nil {
			os.Stderr.WriteString("worker: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// testRunner runs this test binary as the workers.
func testRunner(t *testing.T, procs int) Runner {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return Runner{Command: []string{exe}, Env: []string{"CAPACITY_TEST_WORKER=1"}, Procs: procs,
		Warmup: 100 * time.Millisecond, Duration: 300 * time.Millisecond}
}

func TestSeededKeysVerify(t *testing.T) {
	ctx := context.Background()
	url := schematest.NewDatabase(t)
	s, err := Seed(ctx, url, 50, 7)
	if err != nil {
		t.Fatal(err)
	}
	if s.Keys != 50 || s.Orgs != 7 || s.Took == 0 || s.TableBytes == 0 || s.SharedBuffers == "" {
		t.Errorf("Seed = %+v", s)
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	format, err := keystore.NewFormat(KeyPrefix)
	if err != nil {
		t.Fatal(err)
	}
	store := keystore.New(pool, format)
	orgs := map[string]bool{}
	for i := range 50 {
		k, ok, err := store.Verify(ctx, FullKey(i))
		if err != nil || !ok || k.ID != KeyID(i) || k.OrgID != OrgID(i%7) {
			t.Fatalf("Verify(FullKey(%d)) = %+v, %v, %v; want org %s", i, k, ok, err, OrgID(i%7))
		}
		orgs[k.OrgID] = true
		wrong := KeyPrefix + "_live_" + KeyID(i) + "." + Secret(i+1)
		if _, ok, err := store.Verify(ctx, wrong); ok || err != nil {
			t.Fatalf("key %d with key %d's secret: ok %v, %v", i, i+1, ok, err)
		}
	}
	if len(orgs) != 7 {
		t.Errorf("the keys belong to %d orgs, want 7", len(orgs))
	}
	if _, ok, _ := store.Verify(ctx, FullKey(50)); ok {
		t.Error("key 50 of 50 verified")
	}

	// Seeding the same again leaves the table as it is; other numbers replace it.
	if again, err := Seed(ctx, url, 50, 7); err != nil || again.Took != 0 {
		t.Errorf("Seed again = %+v, %v; want it left as it was", again, err)
	}
	if _, err := Seed(ctx, url, 60, 3); err != nil {
		t.Fatal(err)
	}
	var keys, orgCount int
	err = pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM api_keys), (SELECT count(*) FROM orgs)`).Scan(&keys, &orgCount)
	if err != nil || keys != 60 || orgCount != 3 {
		t.Errorf("after reseeding: %d keys, %d orgs, %v; want 60, 3", keys, orgCount, err)
	}
}

func TestSeedCreatesTheDatabase(t *testing.T) {
	ctx := context.Background()
	base := schematest.NewDatabase(t) // a migrated database, to find the server
	cfg, err := pgx.ParseConfig(base)
	if err != nil {
		t.Fatal(err)
	}
	name := cfg.Database + "_capacity"
	url := strings.Replace(base, "/"+cfg.Database, "/"+name, 1)
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), base)
		if err != nil {
			return
		}
		defer conn.Close(context.Background())
		conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	if _, err := Seed(ctx, url, 3, 1); err != nil {
		t.Fatal(err)
	}
}

func TestKeysHaveTheKeyShape(t *testing.T) {
	format, err := keystore.NewFormat(KeyPrefix)
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range []int{0, 7, 999_999, 12_345_678_901_234} {
		id, secret, ok := format.Parse(FullKey(i))
		if !ok || id != KeyID(i) || secret != Secret(i) || len(id) != keystore.KeyIDLen {
			t.Errorf("Parse(FullKey(%d)) = %q, %q, %v", i, id, secret, ok)
		}
	}
	if KeyID(1) == KeyID(10) || Secret(1) == Secret(10) {
		t.Error("two keys alike")
	}
}

func TestKeysPrintsEveryNthKey(t *testing.T) {
	var out strings.Builder
	if err := Main(context.Background(), []string{"keys", "-count", "3", "-every", "500"}, strings.NewReader(""), &out); err != nil {
		t.Fatal(err)
	}
	want := FullKey(0) + "\n" + FullKey(500) + "\n" + FullKey(1000) + "\n"
	if out.String() != want {
		t.Errorf("keys printed %q, want %q", out.String(), want)
	}
}

func TestHitCellHasNoShareWithoutBlocks(t *testing.T) {
	for _, tc := range []struct {
		counters []float64
		want     string
	}{
		{[]float64{95, 5}, "95.0"},
		{[]float64{0, 10}, "0.0"},
		{[]float64{0, 0}, "—"}, // every lookup on a standby: the primary read no block
		{nil, "—"},
	} {
		if got := hitCell(tc.counters); got != tc.want {
			t.Errorf("hitCell(%v) = %q, want %q", tc.counters, got, tc.want)
		}
	}
}

func TestQuantile(t *testing.T) {
	counts := make([]uint64, latencyBuckets)
	counts[bucketOf(500*time.Microsecond)] = 98
	counts[bucketOf(20*time.Millisecond)] = 2
	for _, tc := range []struct {
		q        float64
		low, top time.Duration
	}{
		{0.5, 500 * time.Microsecond, 545 * time.Microsecond},
		{0.98, 500 * time.Microsecond, 545 * time.Microsecond},
		{0.99, 20 * time.Millisecond, 21800 * time.Microsecond},
		{1, 20 * time.Millisecond, 21800 * time.Microsecond},
	} {
		if got := quantile(counts, tc.q); got < tc.low || got > tc.top {
			t.Errorf("quantile(%v) = %v, want %v..%v", tc.q, got, tc.low, tc.top)
		}
	}
	if got := quantile(make([]uint64, latencyBuckets), 0.5); got != 0 {
		t.Errorf("quantile of nothing = %v", got)
	}
	if b := bucketOf(time.Hour); b != latencyBuckets-1 {
		t.Errorf("bucketOf(1h) = %d, want the last", b)
	}
	if b := bucketOf(0); b != 0 {
		t.Errorf("bucketOf(0) = %d", b)
	}
}

func TestScriptCalls(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_get:calls=5,usec=1,usec_per_call=0.2\r\n" +
		"cmdstat_evalsha:calls=120,usec=900,usec_per_call=7.5,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_eval:calls=3,usec=40,usec_per_call=13.3\r\ncmdstat_evalsha_ro:calls=9\r\n"
	if got := scriptCalls(info); got != 123 {
		t.Errorf("scriptCalls = %v, want 123", got)
	}
}

// TestServeReportsTheWindow runs a worker's loop on an op that fails one call in
// three and refuses one in three, and checks its report adds up.
func TestServeReportsTheWindow(t *testing.T) {
	var n atomic.Uint64
	do := func(ctx context.Context, rng *rand.Rand) error {
		switch n.Add(1) % 3 {
		case 1:
			return errors.New("broken")
		case 2:
			return errRejected
		}
		time.Sleep(100 * time.Microsecond) // the op's work, which takes time on purpose
		return nil
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	done := make(chan error, 1)
	go func() {
		rounds := func() (uint64, uint64) {
			r := n.Load()
			return r, 2 * r
		}
		done <- serve(context.Background(), 4, do, rounds, inR, outW)
	}()
	buf := make([]byte, len("ready\n"))
	if _, err := io.ReadFull(outR, buf); err != nil || string(buf) != "ready\n" {
		t.Fatalf("first line %q, %v", buf, err)
	}
	io.WriteString(inW, "go\n")
	start := n.Load()
	testenv.Eventually(t, 30*time.Second, "300 operations", func() bool { return n.Load() >= start+300 })
	io.WriteString(inW, "stop\n")
	var rep workerReport
	if err := json.NewDecoder(outR).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var timed uint64
	for _, c := range rep.Latency {
		timed += c
	}
	// The report's window opens when the worker reads "go" and closes when it reads
	// "stop", a little after this loop's: of the 300 counted here, a busy machine may
	// put a good part outside it. The report must cover the window, whatever its size,
	// and add up.
	if rep.Ops < 100 || timed != rep.Ops || rep.Errors == 0 || rep.Rejected == 0 || rep.Errors+rep.Rejected >= rep.Ops {
		t.Errorf("report %+v (%d timed)", rep, timed)
	}
	if rep.Items != 2*rep.Rounds || rep.Rounds == 0 || rep.Error != "broken" {
		t.Errorf("rounds %d, items %d, error %q", rep.Rounds, rep.Items, rep.Error)
	}
}

// inFlight is how many operations a level can have in flight: a round trip counts its
// operations when it is sent, and they count as done when they are answered, so at
// either edge of the window that many may be in one count and not the other.
func inFlight(lv Level) uint64 { return uint64(lv.Procs * lv.Waiters) }

func TestLookupsThroughBatchers(t *testing.T) {
	ctx := context.Background()
	url := schematest.NewDatabase(t)
	if _, err := Seed(ctx, url, 200, 5); err != nil {
		t.Fatal(err)
	}
	l := Lookups{DatabaseURL: url, Keys: 200, Lanes: 1, Timeout: 5 * time.Second}
	levels, err := l.Run(ctx, testRunner(t, 2), []int{1, 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, lv := range levels {
		if lv.Ops == 0 || lv.Errors+lv.Rejected != 0 || lv.Rounds == 0 || lv.Items < lv.Rounds || lv.Items > lv.Ops+inFlight(lv) ||
			len(lv.Servers) != 1 || len(lv.Counters) != 2 || lv.Procs != 2 {
			t.Errorf("W=%d: %+v", lv.Waiters, lv)
		}
	}
	// One goroutine a Batcher: every query holds one key id.
	if lv := levels[0]; lv.Items != lv.Rounds {
		t.Errorf("W=1: %d key ids in %d queries", lv.Items, lv.Rounds)
	}
}

func TestCountsThroughPipelines(t *testing.T) {
	for _, tc := range []struct {
		name    string
		url     func(*testing.T) string
		cluster bool
	}{
		{"single", func(t *testing.T) string { return redistest.URL(t) }, false},
		{"cluster", func(t *testing.T) string { return testenv.GetenvOrSkip(t, "REDIS_CLUSTER_URL") }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := Counts{RedisURL: tc.url(t), Cluster: tc.cluster, Keys: 1000, Timeout: 2 * time.Second}
			levels, err := c.Run(context.Background(), testRunner(t, 2), []int{1, 8})
			if err != nil {
				t.Fatal(err)
			}
			for _, lv := range levels {
				if lv.Ops == 0 || lv.Errors != 0 || lv.Rounds == 0 || lv.Items < lv.Rounds || lv.Items > lv.Ops+inFlight(lv) {
					t.Errorf("W=%d: %+v", lv.Waiters, lv)
				}
				if len(lv.Servers) != len(lv.Counters) || (tc.cluster && len(lv.Servers) < 2) {
					t.Errorf("W=%d: %d probes, %d counters", lv.Waiters, len(lv.Servers), len(lv.Counters))
				}
				for i, calls := range lv.Counters {
					if calls == 0 {
						t.Errorf("W=%d: primary %d ran no script", lv.Waiters, i)
					}
				}
			}
			if lv := levels[0]; lv.Items != lv.Rounds {
				t.Errorf("W=1: %d calls in %d round trips", lv.Items, lv.Rounds)
			}
		})
	}
}

// TestCountsWithBudgets: with Orgs, every count goes through the budgets of its key's
// org (Seed's), so the orgs' month counters hold every count made.
func TestCountsWithBudgets(t *testing.T) {
	ctx := context.Background()
	rdb := redistest.Client(t)
	const orgs = 3
	var months []string
	for n := range orgs {
		found, err := rdb.Keys(ctx, "keygate:rl:{o:"+OrgID(n)+"}:M:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		months = append(months, found...)
	}
	if len(months) > 0 {
		if err := rdb.Del(ctx, months...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	c := Counts{RedisURL: redistest.URL(t), Keys: 30, Orgs: orgs, Timeout: 2 * time.Second}
	levels, err := c.Run(ctx, testRunner(t, 2), []int{1, 8})
	if err != nil {
		t.Fatal(err)
	}
	var ops uint64
	for _, lv := range levels {
		if lv.Ops == 0 || lv.Errors != 0 || lv.Rounds == 0 {
			t.Errorf("W=%d: %+v", lv.Waiters, lv)
		}
		ops += lv.Ops
	}
	var counted int64
	for n := range orgs {
		found, err := rdb.Keys(ctx, "keygate:rl:{o:"+OrgID(n)+"}:M:*").Result()
		if err != nil || len(found) != 1 {
			t.Fatalf("org %d: month counters %q, %v; want one", n, found, err)
		}
		v, err := rdb.Get(ctx, found[0]).Int64()
		if err != nil || v == 0 {
			t.Fatalf("org %d: month %d, %v", n, v, err)
		}
		counted += v
	}
	// The months hold the warm-ups' counts too, and the windows' own.
	if counted < int64(ops) {
		t.Errorf("the orgs' months hold %d counts, the windows measured %d", counted, ops)
	}
}

func TestLastUsedWrites(t *testing.T) {
	ctx := context.Background()
	url := schematest.NewDatabase(t)
	if _, err := Seed(ctx, url, 100, 2); err != nil {
		t.Fatal(err)
	}
	w := LastUsedWrites{DatabaseURL: url, Keys: 100, Sizes: []int{10, 60}, PerSize: 100}
	flushes, err := w.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(flushes) != 2 || flushes[0].Flushes != 10 || flushes[1].Flushes != 2 || flushes[0].IDs != 10 {
		t.Errorf("flushes %+v", flushes)
	}
	var used int
	if err := pgxConnQueryInt(ctx, url, `SELECT count(*) FROM api_key_last_used`, &used); err != nil || used != 100 {
		t.Errorf("%d keys have a last_used_at, %v; want all 100", used, err)
	}
	if _, err := (LastUsedWrites{DatabaseURL: url, Keys: 100, Sizes: []int{101}, PerSize: 1}).Run(ctx); err == nil {
		t.Error("flushing more keys than there are: no error")
	}
}

func TestUsageWrites(t *testing.T) {
	ctx := context.Background()
	url := schematest.NewDatabase(t)
	w := UsageWrites{DatabaseURL: url, Orgs: 7, Sizes: []int{10, 60}, PerSize: 100}
	sizes, err := w.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// 10 rows: 10 minutes after the first; 60 rows: the two minutes at least.
	if len(sizes) != 2 || sizes[0].Minutes != 10 || sizes[1].Minutes != 2 || sizes[0].Reads != 7 || sizes[1].Reads != 7 {
		t.Fatalf("sizes %+v", sizes)
	}
	// Every row counted once by each flush: the first minute once, the others twice;
	// all of it rolled up into the days.
	var minutes, days int
	if err := pgxConnQueryInt(ctx, url, `SELECT sum(count)::int FROM usage_minutes WHERE count = rolled`, &minutes); err != nil {
		t.Fatal(err)
	}
	if err := pgxConnQueryInt(ctx, url, `SELECT sum(count)::int FROM usage_days`, &days); err != nil {
		t.Fatal(err)
	}
	if want := 10 + 10*10*2 + 60 + 2*60*2; minutes != want || days != want {
		t.Errorf("minutes rolled up %d, days %d; want %d", minutes, days, want)
	}
	if _, err := (UsageWrites{DatabaseURL: url, Orgs: 7, Sizes: []int{0}, PerSize: 1}).Run(ctx); err == nil {
		t.Error("flushing 0 rows: no error")
	}
}

func pgxConnQueryInt(ctx context.Context, url, sql string, v *int) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql).Scan(v)
}

func TestMainRefusesBadUsage(t *testing.T) {
	for _, args := range [][]string{
		nil,
		{"nonsense"},
		{"worker"},
		{"worker", "nonsense"},
		{"lookups", "-waiters", "1,x"},
		{"counts", "-waiters", "0"},
		{"lastused", "-sizes", "-3"},
		{"usage", "-sizes", "1,x"},
		{"keys", "-every", "0"},
		{"worker", "lookups", "-keys", "0"},
	} {
		if err := Main(context.Background(), args, strings.NewReader(""), io.Discard); err == nil {
			t.Errorf("Main(%q) = nil", args)
		}
	}
}
