package usageexport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/usageexport"
	"github.com/keygate/keygate/upstream/webhook"
)

// wantEvent checks that raw, one event of a batch, is exactly the CloudEvent of key's
// minute with data (the members after "minute", as JSON).
func wantEvent(t *testing.T, raw json.RawMessage, id, org, key string, m time.Time, data string) {
	t.Helper()
	want := fmt.Sprintf(`{"specversion":"1.0","id":%q,"source":"keygate","type":"com.keygate.api.usage","time":%q,`+
		`"subject":%q,"datacontenttype":"application/json","data":{"org_id":%q,"key_id":%q,"minute":%q,%s}}`,
		id, minute(m), org, org, key, minute(m), data)
	var got, exp any
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("event %s: %v", raw, err)
	}
	if err := json.Unmarshal([]byte(want), &exp); err != nil {
		t.Fatalf("want %s: %v", want, err)
	}
	if !reflect.DeepEqual(got, exp) {
		t.Errorf("event\n%s\nwant\n%s", raw, want)
	}
}

// rawEvents returns the events of p as they were sent.
func rawEvents(t *testing.T, p post) []json.RawMessage {
	t.Helper()
	var out []json.RawMessage
	if err := json.Unmarshal(p.Body, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestEachKeysSettledMinuteIsOneEventWithTheUsageAPIsNumbers(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	obs := &counter{}
	x := e.exporter(config(rc), obs)
	m0 := e.clock.Now().Truncate(time.Minute) // the export's first minute
	m1, m2 := m0.Add(time.Minute), m0.Add(2*time.Minute)
	e.record(keyA, m0.Add(5*time.Second), keystore.OutcomeProxied, 200, 1, 3)
	e.record(keyA, m0.Add(10*time.Second), keystore.OutcomeProxied, 502, 5, 2)
	e.record(keyA, m0.Add(59*time.Second), keystore.OutcomeRateLimited, 429, 5, 4)
	e.record(keyB, m0, keystore.OutcomeMe, 200, 1, 1)
	e.record(keyZ, m1, keystore.OutcomeForbidden, 403, 2, 2)
	e.record(keyA, m1.Add(30*time.Second), keystore.OutcomeIPDenied, 401, 1, 1)
	e.record(keyA, m2, keystore.OutcomeProxied, 200, 1, 7)

	// m0 settles 2 minutes after its end; m1 a second later is not settled.
	e.at(m1.Add(2*time.Minute - time.Second))
	if n, err := x.Cut(context.Background()); err != nil || n != 0 {
		t.Fatalf("a second before m0 settled: cut %d events (%v), want 0", n, err)
	}
	e.at(m1.Add(2 * time.Minute))
	drain(t, x)
	posts := rc.got()
	if len(posts) != 1 || len(posts[0].Events) != 2 {
		t.Fatalf("m0 settled: %d posts %v, want one of 2 events", len(posts), ids(posts))
	}
	p := posts[0]
	if ct := p.Header.Get("Content-Type"); ct != "application/cloudevents-batch+json" {
		t.Errorf("Content-Type = %q", ct)
	}
	for _, h := range []string{"webhook-id", "webhook-timestamp", "webhook-signature", "Authorization"} {
		if v := p.Header.Get(h); v != "" {
			t.Errorf("unsigned, without a token: %s = %q", h, v)
		}
	}
	// The events come ordered by minute and id; find each key's.
	for i, ev := range p.Events {
		raw := rawEvents(t, p)[i]
		switch ev.Data.KeyID {
		case keyA:
			wantEvent(t, raw, ev.ID, e.org, keyA, m0,
				`"requests":9,"units":33,"outcomes":{"proxied":{"count":5,"units":13},"rate_limited":{"count":4,"units":20}}`)
		case keyB:
			wantEvent(t, raw, ev.ID, e.org, keyB, m0, `"requests":1,"units":1,"outcomes":{"me":{"count":1,"units":1}}`)
		default:
			t.Errorf("an event of key %s", ev.Data.KeyID)
		}
		if !strings.HasPrefix(ev.ID, "usage_") || len(ev.ID) != len("usage_")+32 {
			t.Errorf("id %q", ev.ID)
		}
	}

	e.at(m2.Add(2*time.Minute + 59*time.Second)) // m1 settled, m2 not
	drain(t, x)
	posts = rc.got()
	got := sums(posts)
	api := e.api(m0, m2.Add(time.Minute))
	if len(api) != 5 {
		t.Fatalf("the usage API shows %d key minutes:\n%s", len(api), show(api))
	}
	delete(api, keyMinute{keyA, minute(m2)})
	if !maps.Equal(got, api) {
		t.Errorf("exported:\n%s\nthe usage API, settled minutes:\n%s", show(got), show(api))
	}
	if n := len(ids(posts)); n != 4 || obs.get(usageexport.ResultDelivered) != 4 || obs.get(usageexport.ResultRetrying) != 0 {
		t.Errorf("%d events sent, %d counted delivered, %d retrying; want one a key's minute, 4", n,
			obs.get(usageexport.ResultDelivered), obs.get(usageexport.ResultRetrying))
	}
	if n := upstreamtest.Scalar[int64](e.Env, `SELECT count(*) FROM usage_export_events`); n != 0 {
		t.Errorf("%d events left in the outbox after their delivery", n)
	}
}

func TestAReceiverAnswering503GetsTheSameIDsAndDataAgainOnTheBackoffSchedule(t *testing.T) {
	e := newEnv(t)
	const failures = 6
	rc := newReceiver(t, func(n int) int {
		if n < failures {
			return 503
		}
		return 200
	})
	obs := &counter{}
	x := e.exporter(config(rc), obs) // backoff 5 s, at most a minute
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 2)
	e.record(keyB, m0, keystore.OutcomeProxied, 201, 3, 1)
	e.at(m0.Add(3 * time.Minute))
	if n, err := x.Cut(context.Background()); err != nil || n != 2 {
		t.Fatalf("cut %d events (%v), want 2", n, err)
	}
	deliver := func() (int, bool) {
		t.Helper()
		n, ok, err := x.Deliver(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n, ok
	}
	if n, ok := deliver(); n != 2 || ok {
		t.Fatalf("first attempt: %d events, delivered %v; want 2, not delivered", n, ok)
	}
	// After the nth failure the events wait 5 s × 2^(n-1), at most a minute.
	for i, wait := range []time.Duration{5, 10, 20, 40, 60, 60} {
		wait *= time.Second
		e.clock.Advance(wait - time.Second)
		if n, _ := deliver(); n != 0 {
			t.Fatalf("%s after failure %d: %d events attempted, want none before %s", wait-time.Second, i+1, n, wait)
		}
		e.clock.Advance(time.Second)
		n, ok := deliver()
		if n != 2 || ok != (i+2 > failures) {
			t.Fatalf("%s after failure %d: %d events, delivered %v", wait, i+1, n, ok)
		}
	}
	posts := rc.got()
	if len(posts) != failures+1 {
		t.Fatalf("%d posts, want %d", len(posts), failures+1)
	}
	for i, p := range posts[1:] {
		if string(p.Body) != string(posts[0].Body) {
			t.Errorf("attempt %d sent\n%s\nthe first sent\n%s", i+2, p.Body, posts[0].Body)
		}
	}
	if got := ids(posts[:1]); len(got) != 2 || got[0] == got[1] {
		t.Errorf("ids %v", got)
	}
	if obs.get(usageexport.ResultRetrying) != 2*failures || obs.get(usageexport.ResultDelivered) != 2 {
		t.Errorf("counted %d retrying and %d delivered, want %d and 2", obs.get(usageexport.ResultRetrying),
			obs.get(usageexport.ResultDelivered), 2*failures)
	}
	if n, _ := deliver(); n != 0 || len(rc.got()) != failures+1 {
		t.Errorf("after the delivery: %d more events attempted", n)
	}
}

func TestAMinuteSettledWhileTheExportWasDownIsExportedAfterItsRestart(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	first := e.exporter(config(rc), nil)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 2)
	e.at(m0.Add(3 * time.Minute))
	drain(t, first)

	// The upstream stops. Its gateways go on counting; minutes settle meanwhile.
	m1, m2 := m0.Add(time.Minute), m0.Add(2*time.Minute)
	e.record(keyA, m1, keystore.OutcomeProxied, 200, 2, 3)
	e.record(keyB, m2, keystore.OutcomeRateLimited, 429, 1, 4)
	e.at(m2.Add(40 * time.Minute))

	restarted := e.exporter(config(rc), nil)
	if lag, err := restarted.Lag(context.Background()); err != nil || lag != 38*time.Minute {
		t.Errorf("before its first cut, the oldest settled minute not exported is %s old (%v), want m1's 38m", lag, err)
	}
	drain(t, restarted)
	got, api := sums(rc.got()), e.api(m0, m2.Add(time.Minute))
	if !maps.Equal(got, api) || len(api) != 3 {
		t.Errorf("exported:\n%s\nthe usage API:\n%s", show(got), show(api))
	}
	if lag, err := restarted.Lag(context.Background()); err != nil || lag != 0 {
		t.Errorf("after it: lag %s (%v), want 0", lag, err)
	}
}

func TestALateFlushGivesACorrectionEventWhoseSumIsRight(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	x := e.exporter(config(rc), nil)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 2, 3)
	e.at(m0.Add(3 * time.Minute))
	drain(t, x)

	// A gateway that could not reach PostgreSQL writes its counts of m0 late.
	e.record(keyA, m0.Add(20*time.Second), keystore.OutcomeProxied, 200, 2, 2)
	e.record(keyA, m0.Add(30*time.Second), keystore.OutcomeProxied, 502, 2, 1)
	e.record(keyA, m0.Add(40*time.Second), keystore.OutcomeRateLimited, 429, 2, 1)
	e.clock.Advance(time.Second)
	drain(t, x)
	posts := rc.got()
	if len(posts) != 2 {
		t.Fatalf("%d posts, want the first event's and the correction's", len(posts))
	}
	first, correction := posts[0].Events[0], posts[1].Events[0]
	if first.ID == correction.ID {
		t.Errorf("the correction has the first event's id %s", first.ID)
	}
	wantEvent(t, rawEvents(t, posts[0])[0], first.ID, e.org, keyA, m0,
		`"requests":3,"units":6,"outcomes":{"proxied":{"count":3,"units":6}}`)
	wantEvent(t, rawEvents(t, posts[1])[0], correction.ID, e.org, keyA, m0,
		`"requests":4,"units":8,"outcomes":{"proxied":{"count":3,"units":6},"rate_limited":{"count":1,"units":2}}`)
	if got, api := sums(posts), e.api(m0, m0.Add(time.Minute)); !maps.Equal(got, api) {
		t.Errorf("exported:\n%s\nthe usage API:\n%s", show(got), show(api))
	}
	e.clock.Advance(time.Minute)
	drain(t, x)
	if n := len(rc.got()); n != 2 {
		t.Errorf("nothing changed, yet %d posts", n)
	}
}

func TestBatchesAreSignedAsWebhooksAreAndCarryTheToken(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, func(n int) int { return []int{500, 204}[min(n, 1)] })
	cfg := config(rc)
	cfg.Secret, cfg.Token, cfg.BatchSize = webhook.NewSecret(), "om_test_0123456789", 2
	x := e.exporter(cfg, nil)
	m0 := e.clock.Now().Truncate(time.Minute)
	for _, k := range []string{keyA, keyB, keyZ} {
		e.record(k, m0, keystore.OutcomeProxied, 200, 1, 1)
	}
	e.at(m0.Add(3 * time.Minute))
	drain(t, x) // 2 events fail; the third goes
	e.clock.Advance(5 * time.Second)
	drain(t, x) // the 2 again
	posts := rc.got()
	if len(posts) != 3 {
		t.Fatalf("%d posts, want 3", len(posts))
	}
	for i, p := range posts {
		id, ts := p.Header.Get("webhook-id"), p.Header.Get("webhook-timestamp")
		sec, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || sec != e.clock.Now().Unix() && sec != e.clock.Now().Add(-5*time.Second).Unix() {
			t.Errorf("post %d: webhook-timestamp %q, want the attempt's time", i, ts)
		}
		if !strings.HasPrefix(id, "msg_") || !webhook.Verify(cfg.Secret, p.Header.Get("webhook-signature"), id, sec, p.Body) {
			t.Errorf("post %d: webhook-id %q, signature %q do not verify", i, id, p.Header.Get("webhook-signature"))
		}
		if webhook.Verify(cfg.Secret, p.Header.Get("webhook-signature"), id, sec, append([]byte(" "), p.Body...)) {
			t.Errorf("post %d: a changed body verifies", i)
		}
		if a := p.Header.Get("Authorization"); a != "Bearer "+cfg.Token {
			t.Errorf("post %d: Authorization %q", i, a)
		}
	}
	// The batch sent again as it was carries the same webhook-id; another, another.
	if a, b, c := posts[0].Header.Get("webhook-id"), posts[2].Header.Get("webhook-id"), posts[1].Header.Get("webhook-id"); a != b || a == c {
		t.Errorf("webhook-ids %s, %s (the retry), %s (another batch)", a, b, c)
	}
}

func TestAnAddressThePolicyRefusesIsRefusedAtEveryConnection(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	cfg := config(rc)
	cfg.Policy = webhook.Policy{AllowHTTP: true} // loopback is not allowed
	obs := &counter{}
	x := e.exporter(cfg, obs)
	m0 := e.clock.Now().Truncate(time.Minute)
	e.record(keyA, m0, keystore.OutcomeProxied, 200, 1, 1)
	e.at(m0.Add(3 * time.Minute))
	drain(t, x)
	if n := len(rc.got()); n != 0 {
		t.Fatalf("the loopback receiver got %d posts", n)
	}
	why := upstreamtest.Scalar[string](e.Env, `SELECT last_error FROM usage_export_events`)
	if !strings.HasPrefix(why, "refused: the destination address is not public") || obs.get(usageexport.ResultRetrying) != 1 {
		t.Errorf("last_error %q, %d counted retrying", why, obs.get(usageexport.ResultRetrying))
	}
}

func TestAMinuteOfMoreRowsThanACutTakesIsStillOneEventPerKey(t *testing.T) {
	e := newEnv(t)
	rc := newReceiver(t, nil)
	cfg := config(rc)
	cfg.BatchSize = usageexport.MaxBatchSize
	x := e.exporter(cfg, nil)
	m0 := e.clock.Now().Truncate(time.Minute)
	// 1,700 keys of 3 rows each: more than a cut transaction's 5,000 rows, so one
	// key's minute straddles its limit.
	const keys = 1700
	for i := range keys {
		k := fmt.Sprintf("key%013d", i)
		e.usage.Record(e.org, k, m0, keystore.OutcomeProxied, 200, 1)
		e.usage.Record(e.org, k, m0, keystore.OutcomeProxied, 500, 2)
		e.usage.Record(e.org, k, m0, keystore.OutcomeRateLimited, 429, 1)
	}
	if err := e.usage.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.at(m0.Add(3 * time.Minute))
	drain(t, x)
	posts := rc.got()
	seen := map[string]bool{}
	for _, p := range posts {
		for _, ev := range p.Events {
			if seen[ev.Data.KeyID] {
				t.Fatalf("key %s has two events", ev.Data.KeyID)
			}
			seen[ev.Data.KeyID] = true
			if ev.Data.Requests != 3 || ev.Data.Units != 4 || len(ev.Data.Outcomes) != 2 || ev.Data.Outcomes["proxied"] != (usageexport.Outcome{Count: 2, Units: 3}) {
				t.Fatalf("key %s: %+v", ev.Data.KeyID, ev.Data)
			}
		}
	}
	if len(seen) != keys || len(posts) != 2 {
		t.Errorf("%d keys' events in %d posts, want %d in 2", len(seen), len(posts), keys)
	}
}
