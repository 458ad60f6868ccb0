package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/keygate/keygate/internal/testkit/promtest"
	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/webhook"
)

// exportReceiver is a usage export receiver on loopback: it verifies each batch's
// signature and token, answers 503 to the first, and keeps the events of the others.
type exportReceiver struct {
	*httptest.Server
	t      *testing.T
	secret string
	token  string
	mu     sync.Mutex
	posts  int
	events []exportedEvent
}

// exportedEvent is what the tests read of an exported event.
type exportedEvent struct {
	ID      string `json:"id"`
	Type    string `json:"type"`
	Subject string `json:"subject"`
	Data    struct {
		KeyID    string `json:"key_id"`
		Minute   string `json:"minute"`
		Requests int64  `json:"requests"`
		Units    int64  `json:"units"`
	} `json:"data"`
}

func newExportReceiver(t *testing.T, secret, token string) *exportReceiver {
	rc := &exportReceiver{t: t, secret: secret, token: token}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if a := r.Header.Get("Authorization"); a != "Bearer "+token {
			t.Errorf("a batch with Authorization %q", a)
		}
		ts, _ := strconv.ParseInt(r.Header.Get("webhook-timestamp"), 10, 64)
		if !webhook.Verify(secret, r.Header.Get("webhook-signature"), r.Header.Get("webhook-id"), ts, body) {
			t.Errorf("a batch whose signature does not verify: %s", body)
		}
		var batch []exportedEvent
		if err := json.Unmarshal(body, &batch); err != nil || r.Header.Get("Content-Type") != "application/cloudevents-batch+json" {
			t.Errorf("a batch of %s: %s (%v)", r.Header.Get("Content-Type"), body, err)
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		rc.posts++
		if rc.posts == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rc.events = append(rc.events, batch...)
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// sums returns the requests and units of the events taken, by "key minute", and how
// many times the most repeated id came.
func (rc *exportReceiver) sums() (map[string][2]int64, int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out, seen, most := map[string][2]int64{}, map[string]int{}, 0
	for _, ev := range rc.events {
		k := ev.Data.KeyID + " " + ev.Data.Minute
		out[k] = [2]int64{out[k][0] + ev.Data.Requests, out[k][1] + ev.Data.Units}
		seen[ev.ID]++
		most = max(most, seen[ev.ID])
	}
	return out, most
}

// minuteSums reads orgID's usage record by minute in [from, to) and sums it by "key
// minute", requests and units.
func (c *Client) minuteSums(orgID string, from, to time.Time) map[string][2]int64 {
	c.s.t.Helper()
	r := c.do("GET", "/orgs/"+orgID+"/usage?"+url.Values{"granularity": {"minute"},
		"from": {from.Format(time.RFC3339)}, "to": {to.Format(time.RFC3339)}}.Encode(), nil, nil)
	var body struct {
		Data []struct {
			KeyID string `json:"key_id"`
			Start string `json:"start"`
			Count int64  `json:"count"`
			Units int64  `json:"units"`
		} `json:"data"`
	}
	if r.Status != 200 || json.Unmarshal(r.Body, &body) != nil {
		c.s.t.Fatalf("reading usage: %d %s", r.Status, r.Body)
	}
	out := map[string][2]int64{}
	for _, row := range body.Data {
		k := row.KeyID + " " + row.Start
		out[k] = [2]int64{out[k][0] + row.Count, out[k][1] + row.Units}
	}
	return out
}

// TestUsageIsExportedOnceByTwoUpstreamsAndAfterARestart runs bin/upstream with the
// usage export to a loopback receiver: the settled minutes' events, signed, add up to
// the usage API's numbers per key and minute, through a refused batch, a restart with
// minutes settled meanwhile, a late write, and a second upstream exporting beside the
// first, each event taken once.
func TestUsageIsExportedOnceByTwoUpstreamsAndAfterARestart(t *testing.T) {
	// The token comes from the environment, as operators should set it.
	secret, token := webhook.NewSecret(), "om_token_0123456789abcdef"
	t.Setenv("USAGE_EXPORT_TOKEN", token)
	rc := newExportReceiver(t, secret, token)
	export := []string{"--webhook-allow-http", "--webhook-allow-private", "--usage-export-url", rc.URL + "/api/v1/events",
		"--usage-export-delay", "0s", "--usage-export-interval", "200ms", "--usage-export-backoff", "200ms",
		"--usage-export-secret", secret, "--usage-export-batch-size", "3"}
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	s := newStackWith(t, stackOptions{upstreamArgs: append([]string{"--admin-addr", admin}, export...)})
	s.neverLog(secret)
	s.neverLog(token)
	org, owner := s.newOwner("pro")
	a, _ := owner.createKey(org.ID, "a", "Editor", nil)
	b, _ := owner.createKey(org.ID, "b", "Viewer", nil)

	// The export began with the minute the upstream started in. It is moved 10
	// minutes back, as if it had run since, so that the minutes below are its own and
	// settled (a delay of 0 s settles a minute as it ends).
	conn, err := pgx.Connect(context.Background(), s.dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(context.Background(), `UPDATE usage_export SET since = since - interval '10 minutes'`); err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Minute)
	from := now.Add(-8 * time.Minute)
	s.recordUsage(org.ID,
		usageRow{a, from, keystore.OutcomeProxied, 200, 3},
		usageRow{a, from, keystore.OutcomeRateLimited, 429, 2},
		usageRow{b, from, keystore.OutcomeMe, 200, 1},
		usageRow{b, from.Add(time.Minute), keystore.OutcomeProxied, 200, 4},
	)
	exported := func(what string) {
		t.Helper()
		var got map[string][2]int64
		var most int
		testenv.Eventually(t, 30*time.Second, what, func() bool {
			got, most = rc.sums()
			return maps.Equal(got, owner.minuteSums(org.ID, from, now))
		})
		if most != 1 {
			t.Errorf("%s: an event came %d times", what, most)
		}
	}
	exported("the settled minutes exported, through a 503")

	// Stopped, the upstream exports nothing; a minute settles meanwhile, and a gateway
	// writes a minute already exported late.
	s.stopUpstream()
	s.recordUsage(org.ID,
		usageRow{a, from.Add(2 * time.Minute), keystore.OutcomeForbidden, 403, 2},
		usageRow{a, from, keystore.OutcomeProxied, 200, 5},
	)
	s.startUpstream()
	exported("the minute settled while it was down, and the correction, after its restart")

	second := s.start("upstream 2", s.cliEnv, append([]string{filepath.Join(s.bin, "upstream"), "serve",
		"--addr", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, export...)...)
	defer second.stop()
	var rows []usageRow
	for i := range 5 {
		rows = append(rows, usageRow{a, from.Add(time.Duration(3+i) * time.Minute), keystore.OutcomeProxied, 200, 1 + i},
			usageRow{b, from.Add(time.Duration(3+i) * time.Minute), keystore.OutcomeProxied, 201, 2})
	}
	s.recordUsage(org.ID, rows...)
	exported("every minute, with two upstreams exporting")

	m := promtest.Scrape(t, "http://"+admin+"/metrics")
	if m[`keygate_upstream_usage_export_events_total{result="delivered"}`] < 1 {
		t.Errorf("the first upstream counts no event delivered: %v", m)
	}
	if _, ok := m["keygate_upstream_usage_export_oldest_age_seconds"]; !ok {
		t.Error("no keygate_upstream_usage_export_oldest_age_seconds")
	}
}
