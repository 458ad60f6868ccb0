package usageexport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/httpapi"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/usageexport"
	"github.com/keygate/keygate/upstream/webhook"
)

// Key ids of the usage the tests record. The usage record needs no key row.
const (
	keyA = "AAAAbbbbCCCCdddd"
	keyB = "BBBBccccDDDDeeee"
	keyZ = "aaaaZZZZyyyyXXXX"
)

// open lets the export send to the loopback receivers over http.
var open = webhook.Policy{AllowHTTP: true, AllowPrivate: true}

// post is one request a receiver got.
type post struct {
	Header http.Header
	Body   []byte
	Events []usageexport.Event
}

// receiver is a usage export receiver on loopback. answer gives the status of its nth
// request (from 0); it answers 204 when nil.
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	posts  []post
	answer func(n int) int
}

func newReceiver(t *testing.T, answer func(n int) int) *receiver {
	t.Helper()
	rc := &receiver{answer: answer}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			return
		}
		p := post{Header: r.Header.Clone(), Body: body}
		if err := json.Unmarshal(body, &p.Events); err != nil {
			t.Errorf("the batch %s is not a JSON array of events: %v", body, err)
		}
		rc.mu.Lock()
		n := len(rc.posts)
		rc.posts = append(rc.posts, p)
		rc.mu.Unlock()
		status := http.StatusNoContent
		if rc.answer != nil {
			status = rc.answer(n)
		}
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) got() []post {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return slices.Clone(rc.posts)
}

// counter is an Observer that counts events by result.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) UsageExportEvents(result string, n int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[result] += n
}

func (c *counter) get(result string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[result]
}

// env is a server on a fresh database with a clock, an org, a client of its Owner,
// and a usage recorder as the gateways have.
type env struct {
	*upstreamtest.Env
	org   string
	owner *upstreamtest.Client
	clock *upstreamtest.Clock
	usage *keystore.Usage
}

func newEnv(t *testing.T) *env {
	t.Helper()
	clock := upstreamtest.NewClock()
	e := upstreamtest.NewEnv(t, func(c *httpapi.Config) { c.Now = clock.Now })
	org := e.Org("pro")
	return &env{Env: e, org: org, owner: e.Person(store.RoleOwner, org), clock: clock,
		usage: keystore.NewUsage(e.Pool, keystore.UsageOptions{})}
}

// config is the export's configuration the tests start from: rc's URL, a delay of 2
// minutes, a backoff of 5 s up to a minute.
func config(rc *receiver) usageexport.Config {
	return usageexport.Config{URL: rc.URL, Delay: 2 * time.Minute, Interval: time.Second, BatchSize: 100,
		Timeout: 10 * time.Second, Backoff: 5 * time.Second, BackoffMax: time.Minute, Policy: open}
}

// exporter returns a started exporter of e on e's clock.
func (e *env) exporter(cfg usageexport.Config, obs usageexport.Observer) *usageexport.Exporter {
	e.T.Helper()
	x := usageexport.New(e.Store, cfg, zap.NewNop(), obs)
	x.Now = e.clock.Now
	if err := x.Start(context.Background()); err != nil {
		e.T.Fatal(err)
	}
	return x
}

// at moves e's clock forward to t.
func (e *env) at(t time.Time) {
	e.T.Helper()
	d := t.Sub(e.clock.Now())
	if d < 0 {
		e.T.Fatalf("the clock is at %s, past %s", e.clock.Now(), t)
	}
	e.clock.Advance(d)
}

// record counts n requests of key in e's org at at, each of cost units, and flushes
// them, as a gateway does.
func (e *env) record(key string, at time.Time, outcome keystore.Outcome, status, cost, n int) {
	e.T.Helper()
	for range n {
		e.usage.Record(e.org, key, at, outcome, status, cost)
	}
	if err := e.usage.Flush(context.Background()); err != nil {
		e.T.Fatal(err)
	}
}

// drain cuts, then delivers until nothing is due; it fails the test on an error.
func drain(t *testing.T, x *usageexport.Exporter) {
	t.Helper()
	if _, err := x.Cut(context.Background()); err != nil {
		t.Fatal(err)
	}
	for {
		n, _, err := x.Deliver(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// keyMinute names a key's minute.
type keyMinute struct {
	Key    string
	Minute string
}

// amount is requests and units.
type amount struct{ Requests, Units int64 }

// sums returns what the events of posts add up to, per key's minute.
func sums(posts []post) map[keyMinute]amount {
	out := map[keyMinute]amount{}
	for _, p := range posts {
		for _, ev := range p.Events {
			k := keyMinute{ev.Data.KeyID, ev.Data.Minute}
			a := out[k]
			a.Requests += ev.Data.Requests
			a.Units += ev.Data.Units
			out[k] = a
		}
	}
	return out
}

// api returns the usage API's requests and units per key's minute in [from, to).
func (e *env) api(from, to time.Time) map[keyMinute]amount {
	e.T.Helper()
	q := url.Values{"granularity": {"minute"}, "from": {from.UTC().Format(time.RFC3339)}, "to": {to.UTC().Format(time.RFC3339)}}
	r := e.owner.Do("GET", "/orgs/"+e.org+"/usage?"+q.Encode(), "")
	upstreamtest.WantStatus(e.T, r, 200)
	var body struct {
		Data []struct {
			KeyID string `json:"key_id"`
			Start string `json:"start"`
			Count int64  `json:"count"`
			Units int64  `json:"units"`
		} `json:"data"`
	}
	r.Decode(e.T, &body)
	out := map[keyMinute]amount{}
	for _, row := range body.Data {
		k := keyMinute{row.KeyID, row.Start}
		a := out[k]
		a.Requests += row.Count
		a.Units += row.Units
		out[k] = a
	}
	return out
}

// show prints sums in order, one key's minute a line.
func show(m map[keyMinute]amount) string {
	var lines []string
	for k, a := range m {
		lines = append(lines, fmt.Sprintf("%s %s requests %d units %d", k.Minute, k.Key[:4], a.Requests, a.Units))
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// ids returns the ids of the events of posts, in order.
func ids(posts []post) []string {
	var out []string
	for _, p := range posts {
		for _, ev := range p.Events {
			out = append(out, ev.ID)
		}
	}
	return out
}

// minute formats a minute as the events do.
func minute(t time.Time) string { return t.UTC().Format(time.RFC3339) }
