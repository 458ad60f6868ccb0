package webhook_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// slowReceiver answers nothing for 30 s, or until the test ends. It counts the
// requests it holds at once.
type slowReceiver struct {
	*httptest.Server
	mu            sync.Mutex
	got, now, max int
}

func newSlowReceiver(t *testing.T) *slowReceiver {
	t.Helper()
	done := make(chan struct{})
	rc := &slowReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc.mu.Lock()
		rc.got++
		rc.now++
		rc.max = max(rc.max, rc.now)
		rc.mu.Unlock()
		defer func() {
			rc.mu.Lock()
			rc.now--
			rc.mu.Unlock()
		}()
		select {
		case <-time.After(30 * time.Second):
		case <-r.Context().Done():
		case <-done:
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(func() { close(done); rc.Close() })
	return rc
}

func (rc *slowReceiver) counts() (got, most int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.got, rc.max
}

// TestASlowReceiverDoesNotDelayAnotherOrganisation fills the outbox with 40 events for
// an endpoint that answers after 30 s, then sends another organisation a test event:
// it arrives within 3 s, on one dispatcher and on two sharing the database, while the
// slow endpoint never has more attempts in flight than its share.
func TestASlowReceiverDoesNotDelayAnotherOrganisation(t *testing.T) {
	for _, instances := range []int{1, 2} {
		t.Run(map[int]string{1: "one instance", 2: "two instances"}[instances], func(t *testing.T) {
			e := newRealEnv(t)
			slow := newSlowReceiver(t)
			slowEP := e.addEndpoint(t, slow.URL)
			e.enqueue(e.org, slowEP, 40)

			other := e.Org("pro")
			otherOwner := e.Person(store.RoleOwner, other)
			arrived := make(chan time.Time, 1)
			fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				select {
				case arrived <- time.Now():
				default:
				}
				w.WriteHeader(http.StatusNoContent)
			}))
			defer fast.Close()
			r := otherOwner.Do("POST", "/orgs/"+other+"/webhooks", upstreamtest.JSONBody(map[string]string{"url": fast.URL}))
			upstreamtest.WantStatus(t, r, 201)
			var fastEP endpoint
			r.Decode(t, &fastEP)

			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer func() { cancel(); wg.Wait() }()
			for range instances {
				d := e.dispatcher(open)
				wg.Go(func() { d.Run(ctx, 200*time.Millisecond) })
			}
			testenv.Eventually(t, 10*time.Second, "the slow receiver holding its share of attempts", func() bool {
				_, most := slow.counts()
				return most == webhook.DefaultPerEndpoint
			})

			sent := time.Now()
			upstreamtest.WantStatus(t, otherOwner.Do("POST", "/orgs/"+other+"/webhooks/"+fastEP.ID+"/test", ""), 202)
			select {
			case at := <-arrived:
				if took := at.Sub(sent); took > 3*time.Second {
					t.Errorf("the other organisation's event arrived after %v, want within 3 s", took)
				}
			case <-time.After(3 * time.Second):
				got, most := slow.counts()
				t.Fatalf("the other organisation's event did not arrive within 3 s (the slow receiver got %d, at most %d at once)", got, most)
			}
			if got, most := slow.counts(); most != webhook.DefaultPerEndpoint {
				t.Errorf("the slow receiver had up to %d attempts at once (of %d), want %d", most, got, webhook.DefaultPerEndpoint)
			}
		})
	}
}

// TestAnOrganisationsEndpointsShareItsSlots gives one organisation slow endpoints
// enough to fill a dispatcher's slots: it holds its share, the organisation's, and
// another organisation's event gets through. Its endpoints take turns within it.
func TestAnOrganisationsEndpointsShareItsSlots(t *testing.T) {
	e := newRealEnv(t)
	var slows []*slowReceiver
	for range 5 {
		rc := newSlowReceiver(t)
		slows = append(slows, rc)
		e.enqueue(e.org, e.addEndpoint(t, rc.URL), 10)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	d := e.dispatcher(open)
	d.Slots = 6
	wg.Go(func() { d.Run(ctx, 200*time.Millisecond) })
	total := func() (got, endpoints int) {
		for _, rc := range slows {
			n, _ := rc.counts()
			got += n
			if n > 0 {
				endpoints++
			}
		}
		return got, endpoints
	}
	testenv.Eventually(t, 10*time.Second, "the organisation's share of attempts in flight", func() bool {
		got, _ := total()
		return got == webhook.DefaultPerOrg
	})

	// A fresh dispatcher's claim finds the organisation at its share: nothing.
	if n, err := e.dispatcher(open).RunOnce(context.Background()); err != nil || n != 0 {
		t.Errorf("another claim took %d (%v), want 0: the organisation has %d attempts in flight", n, err, webhook.DefaultPerOrg)
	}
	if got, endpoints := total(); got != webhook.DefaultPerOrg || endpoints != webhook.DefaultPerOrg {
		t.Errorf("%d attempts in flight on %d endpoints, want %d on %d: its endpoints take turns", got, endpoints, webhook.DefaultPerOrg, webhook.DefaultPerOrg)
	}
	for _, rc := range slows {
		if _, most := rc.counts(); most > webhook.DefaultPerEndpoint {
			t.Errorf("an endpoint had %d attempts at once, want at most %d", most, webhook.DefaultPerEndpoint)
		}
	}
}

// TestARetryAfterATimeoutWaitsFromTheAttemptsEnd lets a real attempt time out after 10
// s: the next comes at least the schedule's 5 s after that attempt ended, not 5 s
// after it began.
func TestARetryAfterATimeoutWaitsFromTheAttemptsEnd(t *testing.T) {
	e := newRealEnv(t)
	var mu sync.Mutex
	var arrivals []time.Time
	done := make(chan struct{})
	rc := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrivals = append(arrivals, time.Now())
		first := len(arrivals) == 1
		mu.Unlock()
		if first {
			select {
			case <-r.Context().Done():
			case <-done:
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer rc.Close()
	defer close(done)
	ep := e.addEndpoint(t, rc.URL)
	e.sendTest(t, ep)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	d := e.dispatcher(open)
	wg.Go(func() { d.Run(ctx, 100*time.Millisecond) })
	testenv.Eventually(t, webhook.Timeout+webhook.Schedule[0]+20*time.Second, "the delivered second attempt", func() bool {
		return upstreamtest.Scalar[string](e.Env, `SELECT state FROM webhook_deliveries`) == store.DeliveryDelivered
	})
	mu.Lock()
	gap := arrivals[1].Sub(arrivals[0])
	mu.Unlock()
	if want := webhook.Timeout + webhook.Schedule[0]; gap < want {
		t.Errorf("the second attempt came %v after the first began, want at least %v (a %v timeout, then %v)", gap, want, webhook.Timeout, webhook.Schedule[0])
	}
	var firstAt, secondAt time.Time
	var firstMS int64
	var firstErr string
	row := e.Pool.QueryRow(context.Background(), `SELECT a.at, a.duration_ms, a.error, b.at FROM webhook_attempts a, webhook_attempts b WHERE a.id < b.id`)
	if err := row.Scan(&firstAt, &firstMS, &firstErr, &secondAt); err != nil {
		t.Fatal(err)
	}
	ended := firstAt.Add(time.Duration(firstMS) * time.Millisecond)
	if firstErr != "timeout: no answer within 10s" || firstMS < webhook.Timeout.Milliseconds() {
		t.Errorf("first attempt: %q after %d ms, want a timeout after 10 s", firstErr, firstMS)
	}
	if wait := secondAt.Sub(ended); wait < webhook.Schedule[0] {
		t.Errorf("the second attempt began %v after the first ended, want at least %v", wait, webhook.Schedule[0])
	}
}
