package integration

// Key lookups on hot standbys (database_read_urls): the stack's two streaming
// standbys (scripts/stack.sh up-standbys), the second replaying every commit seconds
// late. Revocation still applies on the next request through every gateway.

import (
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/internal/testkit/testenv"
)

const (
	lookupsOnStandbys = `keygate_key_lookups_total{server="standby"}`
	lookupsOnPrimary  = `keygate_key_lookups_total{server="primary"}`
)

// newStandbyStack is newStack with both gateways reading keys from the stack's two
// standbys, with more v1_gateway options in extra. It returns once the fast standby
// has replayed the test's database and whatever the suite wrote before it.
func newStandbyStack(t *testing.T, extra string) *Stack {
	t.Helper()
	return newStandbyStackWith(t, stackOptions{gwOptions: extra})
}

// newStandbyStackWith is newStandbyStack with the options o, whose gwOptions follow
// database_read_urls.
func newStandbyStackWith(t *testing.T, o stackOptions) *Stack {
	t.Helper()
	fast := testenv.GetenvOrSkip(t, "DATABASE_STANDBY_FAST_URL")
	slow := testenv.GetenvOrSkip(t, "DATABASE_STANDBY_SLOW_URL")
	defer testenv.WaitForReplay(t, testenv.Getenv(t, "DATABASE_URL"), fast, 2*time.Minute)
	// The test's database has a name of its own; the standbys have it too.
	o.databaseVia = func(direct string) string {
		d, err := url.Parse(direct)
		if err != nil {
			t.Fatal(err)
		}
		for env, base := range map[string]string{"KEYGATE_TEST_STANDBY_FAST": fast, "KEYGATE_TEST_STANDBY_SLOW": slow} {
			u, err := url.Parse(base)
			if err != nil {
				t.Fatal(err)
			}
			u.Path = d.Path
			t.Setenv(env, u.String())
		}
		return direct
	}
	o.gwOptions = "database_read_urls {env.KEYGATE_TEST_STANDBY_FAST} {env.KEYGATE_TEST_STANDBY_SLOW}\n" + o.gwOptions
	return newStackWith(t, o)
}

// standbyCmd runs scripts/stack.sh's stop-standby or start-standby for standby n
// (1 fast, 2 slow).
func (s *Stack) standbyCmd(command string, n int) {
	s.t.Helper()
	if s.stackDir == "" {
		s.t.Fatal("STACK_DIR is not set: run `make test`")
	}
	cmd := exec.Command(filepath.Join(root(s.t), "scripts", "stack.sh"), command, s.stackDir, strconv.Itoa(n))
	if out, err := cmd.CombinedOutput(); err != nil {
		s.t.Fatalf("stack.sh %s %d: %v\n%s", command, n, err, out)
	}
}

// waitForStandbys sends requests with key through every gateway until a standby has
// answered one of each gateway's lookups.
func (s *Stack) waitForStandbys(key string) {
	s.t.Helper()
	for i := range s.gateways {
		testenv.Eventually(s.t, 30*time.Second, "gateway "+strconv.Itoa(i)+"'s lookups on a standby", func() bool {
			if r := s.api(key, i).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
				s.t.Fatalf("GET /v1/me with a live key: %d %s", r.Status, r.Body)
			}
			return s.gatewayMetric(i, lookupsOnStandbys) > 0
		})
	}
}

// TestKeysRevokedThroughTheDashboardAreRefusedOnTheNextRequestThroughStandbys: keys
// revoked one after another, each refused on the very next request by every gateway.
// A lag of a minute keeps the slow standby in: it still has each key for seconds
// after its revocation, and the fence alone keeps that from counting.
func TestKeysRevokedThroughTheDashboardAreRefusedOnTheNextRequestThroughStandbys(t *testing.T) {
	s := newStandbyStack(t, "database_read_max_lag 1m")
	// No rate limit: the requests until a standby answers are not counted.
	org, owner := s.newOwner("enterprise")
	ids, keys := make([]string, 5), make([]string, 5)
	for i := range keys {
		ids[i], keys[i] = owner.createKey(org.ID, "k"+strconv.Itoa(i), "Admin", nil)
	}
	s.waitForStandbys(keys[len(keys)-1])
	for i := range keys {
		for g := range s.gateways {
			if r := s.api(keys[i], g).do("GET", "/v1/me", nil); r.Status != http.StatusOK {
				t.Fatalf("key %d before its revocation, gateway %d: %d %s", i, g, r.Status, r.Body)
			}
		}
		if r := owner.do("DELETE", "/orgs/"+org.ID+"/api-keys/"+ids[i], nil, nil); r.Status != http.StatusNoContent {
			t.Fatalf("revoke: %d %s", r.Status, r.Body)
		}
		for g := range s.gateways {
			for range 3 {
				wantError(t, s.api(keys[i], g).do("GET", "/v1/me", nil), 401, unauthenticated)
			}
		}
	}
}

// TestMostKeyLookupsLeaveThePrimary: with a standby that keeps up, the standbys
// answer most lookups, while the gateways' own usage and last_used_at writes go on.
func TestMostKeyLookupsLeaveThePrimary(t *testing.T) {
	s := newStandbyStack(t, "")
	_, key := s.newKey("enterprise", "Admin")
	s.waitForStandbys(key)
	before, beforePrimary := s.gatewayMetric(0, lookupsOnStandbys), s.gatewayMetric(0, lookupsOnPrimary)
	a := s.api(key, 0)
	for range 300 {
		if r := a.do("GET", "/v1/me", nil); r.Status != http.StatusOK {
			t.Fatalf("GET /v1/me: %d %s", r.Status, r.Body)
		}
	}
	standby := s.gatewayMetric(0, lookupsOnStandbys) - before
	primary := s.gatewayMetric(0, lookupsOnPrimary) - beforePrimary
	t.Logf("of 300 lookups, %v on standbys and %v on the primary", standby, primary)
	if standby+primary != 300 || standby < 2*primary {
		t.Errorf("of 300 lookups, %v on standbys and %v on the primary; want all counted, at least two in three on standbys", standby, primary)
	}
}

// load sends GET /v1/me with key through every gateway of s from a few goroutines
// until stop, and counts the answers by status.
func load(s *Stack, key string, stop *atomic.Bool) (wait func() map[int]int) {
	var (
		mu       sync.Mutex
		statuses = map[int]int{}
		wg       sync.WaitGroup
	)
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				req, _ := http.NewRequest("GET", s.URL(w%len(s.gateways))+"/v1/me", nil)
				req.Header.Set("Authorization", "Bearer "+key)
				status := 0 // no answer at all
				if resp, err := client.Do(req); err == nil {
					status = resp.StatusCode
					resp.Body.Close()
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			}
		}()
	}
	return func() map[int]int {
		wg.Wait()
		return statuses
	}
}

// TestAStandbyStoppedUnderLoadCostsNo503: the standbys stopped one then both under
// load, and started again. Every request is answered 200 throughout, and the
// standbys take lookups again once back.
func TestAStandbyStoppedUnderLoadCostsNo503(t *testing.T) {
	s := newStandbyStack(t, "database_read_max_lag 1m")
	_, key := s.newKey("enterprise", "Admin")
	s.waitForStandbys(key)
	var stop atomic.Bool
	wait := load(s, key, &stop)
	restart := map[int]bool{}
	defer func() {
		stop.Store(true)
		for n := range restart {
			s.standbyCmd("start-standby", n)
		}
	}()
	time.Sleep(500 * time.Millisecond)
	for _, n := range []int{1, 2} {
		s.standbyCmd("stop-standby", n)
		restart[n] = true
		time.Sleep(time.Second)
	}
	for _, n := range []int{1, 2} {
		s.standbyCmd("start-standby", n)
		delete(restart, n)
	}
	stopped := s.gatewayMetric(0, lookupsOnStandbys)
	testenv.Eventually(t, 30*time.Second, "lookups on the standbys again", func() bool {
		return s.gatewayMetric(0, lookupsOnStandbys) > stopped+50
	})
	stop.Store(true)
	statuses := wait()
	if len(statuses) != 1 || statuses[http.StatusOK] == 0 {
		t.Errorf("answers by status %v, want 200 only", statuses)
	}
}

// TestThePrimaryDownAnswers503ThroughStandbys: with the primary down a lookup cannot
// be fenced, so the standbys do not answer it: 503, never a 401 or a 200.
func TestThePrimaryDownAnswers503ThroughStandbys(t *testing.T) {
	s := newStandbyStack(t, "")
	_, key := s.newKey("enterprise", "Admin")
	s.waitForStandbys(key)
	s.stackCmd("stop-pg")
	restarted := false
	defer func() {
		if !restarted {
			s.stackCmd("start-pg")
		}
	}()
	for g := range s.gateways {
		for range 3 {
			r := timed(t, 5*time.Second, func() Resp { return s.api(key, g).do("GET", "/v1/me", nil) })
			wantError(t, r, http.StatusServiceUnavailable, serviceUnavailable)
		}
	}
	s.stackCmd("start-pg")
	restarted = true
	for g := range s.gateways {
		testenv.Eventually(t, 30*time.Second, "gateway "+strconv.Itoa(g)+" answering again", func() bool {
			return s.api(key, g).do("GET", "/v1/me", nil).Status == http.StatusOK
		})
	}
}
