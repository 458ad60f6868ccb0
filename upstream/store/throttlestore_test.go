package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

func TestLoginThrottleIsExactUnderConcurrentGuesses(t *testing.T) {
	// Many instances' reservations racing for one address: exactly the limit pass.
	clock := upstreamtest.NewClock()
	e := upstreamtest.NewEnv(t)
	limits := store.LoginThrottle{Window: time.Minute, PerEmail: 3, PerClient: 5}
	email := store.EmailKey("victim@example.com")
	start := make(chan struct{})
	passed := make(chan int64, 40)
	var wg sync.WaitGroup
	for range cap(passed) {
		wg.Go(func() {
			<-start
			id, wait, err := e.Store.ReserveLogin(context.Background(), limits, "203.0.113.9", email, clock.Now())
			if err != nil {
				t.Error(err)
			}
			if wait == 0 {
				passed <- id
			}
		})
	}
	close(start)
	wg.Wait()
	close(passed)
	if n := len(passed); n != 3 {
		t.Errorf("%d of %d concurrent attempts passed, want 3", n, cap(passed))
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM login_attempts`); n != 3 {
		t.Errorf("%d attempts recorded, want 3", n)
	}
}
