package usageexport_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/usageexport"
)

func TestTwoExportersExportEachEventOnceWhileGatewaysWriteLate(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	cfg := config(rc)
	cfg.BatchSize = 7
	// Two upstreams: each its own pool on the one database.
	var xs []*usageexport.Exporter
	for range 2 {
		x := usageexport.New(store.New(upstreamtest.NewPool(t, e.DBURL, 10*time.Second)), cfg, zap.NewNop(), nil)
		x.Now = e.clock.Now
		if err := x.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		xs = append(xs, x)
	}
	m0 := e.clock.Now().Truncate(time.Minute)
	keys := make([]string, 20)
	for i := range keys {
		keys[i] = fmt.Sprintf("key%013d", i)
	}
	for m := range 4 {
		for _, k := range keys {
			e.usage.Record(e.org, k, m0.Add(time.Duration(m)*time.Minute), keystore.OutcomeProxied, 200, 1+m)
		}
	}
	if err := e.usage.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.at(m0.Add(7 * time.Minute))

	// Both export at once, round after round, while a gateway writes late counts to
	// the minutes they export.
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for _, x := range xs {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				x.RunOnce(context.Background())
			}
		})
	}
	late := keystore.NewUsage(upstreamtest.NewPool(t, e.DBURL, 10*time.Second), keystore.UsageOptions{})
	for range 30 {
		k, m := keys[rand.IntN(len(keys))], rand.IntN(4)
		late.Record(e.org, k, m0.Add(time.Duration(m)*time.Minute+time.Second), keystore.OutcomeRateLimited, 429, 2)
		if err := late.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	drain(t, xs[0])

	posts := rc.got()
	seen := map[string]int{}
	for _, id := range ids(posts) {
		seen[id]++
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s sent %d times", id, n)
		}
	}
	if got, api := sums(posts), e.api(m0, m0.Add(4*time.Minute)); !maps.Equal(got, api) || len(api) != 80 {
		t.Errorf("exported:\n%s\nthe usage API:\n%s", show(got), show(api))
	}
	if len(seen) < 80 {
		t.Errorf("%d events for 80 key minutes", len(seen))
	}
}

// purge rolls the usage record up and purges it at e's clock, as serve's roll-up does,
// and returns the minute rows purged.
func (e *env) purge() int64 {
	e.T.Helper()
	if _, err := e.Store.RollUpUsage(context.Background()); err != nil {
		e.T.Fatal(err)
	}
	minutes, _, _, err := e.Store.PurgeUsage(context.Background(), e.clock.Now())
	if err != nil {
		e.T.Fatal(err)
	}
	return minutes
}

// minuteRows returns how many minute rows key has at m.
func (e *env) minuteRows(key string, m time.Time) int64 {
	e.T.Helper()
	return upstreamtest.Scalar[int64](e.Env, `SELECT count(*) FROM usage_minutes WHERE key_id = $1 AND start = $2`, key, m)
}

func TestThePurgeKeepsAMinuteRowUntilItIsExportedInFull(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	x := e.exporter(config(rc), nil)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 2)
	e.record(keyB, m0, keystore.OutcomeProxied, 200, 1, 5)
	e.at(m0.Add(3 * time.Minute))
	drain(t, x)
	// The export runs on, as serve's does; 60 hours later a gateway that held its
	// counts all along writes them.
	for range 3 {
		e.clock.Advance(20 * time.Hour)
		drain(t, x)
	}
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 1)
	if n := e.purge(); n != 1 || e.minuteRows(keyA, m0) != 1 || e.minuteRows(keyB, m0) != 0 {
		t.Fatalf("purged %d minute rows; left %d of key A's minute, not exported in full, and %d of key B's, exported",
			n, e.minuteRows(keyA, m0), e.minuteRows(keyB, m0))
	}
	drain(t, x)
	want := map[keyMinute]amount{{keyA, minute(m0)}: {3, 3}, {keyB, minute(m0)}: {5, 5}}
	if got := sums(rc.got()); !maps.Equal(got, want) {
		t.Errorf("exported:\n%s\nwant:\n%s", show(got), show(want))
	}
	if n := e.purge(); n != 1 || e.minuteRows(keyA, m0) != 0 {
		t.Errorf("exported in full, the row stays: purged %d", n)
	}
}

func TestAnExportStoppedLongerThanTheHoldResumesAtTheMinutesThePurgeKeeps(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	x := e.exporter(config(rc), nil)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 1)
	e.at(m0.Add(3 * time.Minute))
	drain(t, x)
	// The export stops (no upstream exports) while the roll-up runs on, for longer
	// than the hold: the purge takes a minute never exported once it is 49 hours old.
	m1 := m0.Add(time.Minute)
	e.record(keyA, m1, keystore.OutcomeProxied, 200, 1, 1)
	e.at(m1.Add(store.UsageMinutesKept + time.Hour))
	recent := e.clock.Now().Add(-10 * time.Minute).Truncate(time.Minute)
	e.record(keyB, recent, keystore.OutcomeMe, 200, 1, 4)
	if e.purge(); e.minuteRows(keyA, m1) != 0 {
		t.Fatal("past the hold, the purge kept a minute 50 hours old")
	}
	drain(t, x)
	want := map[keyMinute]amount{{keyA, minute(m0)}: {1, 1}, {keyB, minute(recent)}: {4, 4}}
	if got := sums(rc.got()); !maps.Equal(got, want) {
		t.Errorf("exported:\n%s\nwant:\n%s", show(got), show(want))
	}
	since := upstreamtest.Scalar[time.Time](e.Env, `SELECT since FROM usage_export`)
	if wantSince := e.clock.Now().Add(-48 * time.Hour).Truncate(time.Minute); !since.Equal(wantSince) {
		t.Errorf("the export resumed at %s, want 48 hours back, %s", since.UTC(), wantSince)
	}
}

func TestAnExporterStoppedMidAttemptGivesItsEventsBack(t *testing.T) {
	e := newEnv(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	rc := newReceiver(t, func(n int) int {
		if n == 0 {
			close(arrived)
			<-release // the first attempt hangs until the test ends it
		}
		return 204
	})
	defer close(release)
	obs := &counter{}
	x := e.exporter(config(rc), obs)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 2)
	e.at(m0.Add(3 * time.Minute))
	if _, err := x.Cut(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { <-arrived; stop() }() // the upstream stops while the receiver holds the batch
	if n, delivered, err := x.Deliver(ctx); n != 1 || delivered || err != nil {
		t.Fatalf("the stopped attempt: %d events, delivered %v, %v", n, delivered, err)
	}
	attempts := upstreamtest.Scalar[int64](e.Env, `SELECT attempts FROM usage_export_events WHERE lease IS NULL AND next_attempt_at = $1`, e.clock.Now())
	if attempts != 0 || obs.get(usageexport.ResultRetrying) != 0 {
		t.Errorf("given back with %d attempts, %d counted retrying; want 0, due now", attempts, obs.get(usageexport.ResultRetrying))
	}
	restarted := e.exporter(config(rc), obs)
	drain(t, restarted)
	posts := rc.got()
	if len(posts) != 2 || ids(posts)[0] != ids(posts)[1] || obs.get(usageexport.ResultDelivered) != 1 {
		t.Errorf("%d posts of ids %v, %d delivered; want the same event twice, delivered once", len(posts), ids(posts),
			obs.get(usageexport.ResultDelivered))
	}
}
