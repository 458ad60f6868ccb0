package httpapi

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
)

// The bodies of the plan gates (CONTRACT §6).
const (
	bodyMonitorQuota  = `{"error":"quota_exceeded","metric":"monitors","upgrade":true}`
	bodyIntervalQuota = `{"error":"quota_exceeded","metric":"min_interval_seconds","upgrade":true}`
)

func bodyLocationGated(loc string) string {
	return `{"error":"feature_gated","feature":"location:` + loc + `","upgrade":true}`
}

func bodyTypeGated(typ string) string {
	return `{"error":"feature_gated","feature":"check_type:` + typ + `","upgrade":true}`
}

// small is a plan whose every gate is easy to hit.
var small = planRecord{Name: "small", APIRateLimit: 60, MaxMonitors: 2, MinIntervalSeconds: 60,
	Locations: []string{"us-east", "eu-west"}, CheckTypes: []string{"http", "tcp"}}

func TestCreateGatesApplyInOrderWithIdenticalBodiesOnBothDoors(t *testing.T) {
	e := newTestEnv(t)
	e.plan(small)
	full, roomy := e.org("small"), e.org("small")
	fill := e.doors(full, roleEditor)[1]
	fill.create(t, `{"name":"1","type":"http","target":"https://example.com"}`)
	fill.create(t, `{"name":"2","type":"http","target":"https://example.com"}`)

	// Every body fails the gates from its own onwards, so each case also shows that the
	// gates before it come first.
	for _, tc := range []struct {
		name   string
		org    string
		body   string
		status int
		want   string
	}{
		{"count first", full, `{"name":"n","type":"icmp","target":"example.com","interval_seconds":10,"locations":["us-west"]}`, 402, bodyMonitorQuota},
		{"count before a valid body's gates", full, `{"name":"n","type":"http","target":"https://example.com"}`, 402, bodyMonitorQuota},
		{"interval before locations", roomy, `{"name":"n","type":"icmp","target":"example.com","interval_seconds":59,"locations":["us-west"]}`, 402, bodyIntervalQuota},
		{"locations before type, first lacking in body order", roomy, `{"name":"n","type":"icmp","target":"example.com","interval_seconds":60,"locations":["eu-west","ap-southeast","us-west"]}`, 403, bodyLocationGated("ap-southeast")},
		{"type last", roomy, `{"name":"n","type":"dns","target":"example.com","locations":["us-east"]}`, 403, bodyTypeGated("dns")},
		{"body before gates", full, `{"name":"n","type":"icmp","target":"example.com","interval_seconds":5}`, 400, `{"error":"invalid_request","message":"interval_seconds: must be from 10 to 86400"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var bodies []string
			for _, d := range e.doors(tc.org, roleEditor) {
				r := d.c.do("POST", d.base, tc.body)
				want(t, r, tc.status, tc.want)
				bodies = append(bodies, r.body)
			}
			if bodies[0] != bodies[1] {
				t.Errorf("the doors answer differently:\n%s\n%s", bodies[0], bodies[1])
			}
		})
	}
	if n := scalar[int](e, `SELECT count(*) FROM monitors`); n != 2 {
		t.Errorf("monitors = %d, want only the 2 that filled the org", n)
	}
}

func TestCreateGatesApplyToDefaults(t *testing.T) {
	e := newTestEnv(t)
	e.plan(planRecord{Name: "slow", APIRateLimit: 60, MaxMonitors: 5, MinIntervalSeconds: 600,
		Locations: []string{"eu-west"}, CheckTypes: []string{"http"}})
	org := e.org("slow")
	for _, d := range e.doors(org, roleEditor) {
		// The default interval (300) is below the plan's minimum.
		want(t, d.c.do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com"}`), 402, bodyIntervalQuota)
		// The default location (us-east) is not in the plan.
		want(t, d.c.do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com","interval_seconds":600}`), 403, bodyLocationGated("us-east"))
		wantStatus(t, d.c.do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com","interval_seconds":600,"locations":["eu-west"]}`), 201)
	}
}

func TestMonitorCountGate(t *testing.T) {
	e := newTestEnv(t)
	e.plan(planRecord{Name: "none", APIRateLimit: 60, MaxMonitors: 0, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}})
	e.plan(planRecord{Name: "uncapped", APIRateLimit: 60, MaxMonitors: -1, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}})
	body := `{"name":"n","type":"http","target":"https://example.com"}`

	t.Run("zero allows none", func(t *testing.T) {
		for _, d := range e.doors(e.org("none"), roleEditor) {
			want(t, d.c.do("POST", d.base, body), 402, bodyMonitorQuota)
		}
	})
	t.Run("-1 is no cap", func(t *testing.T) {
		d := e.doors(e.org("uncapped"), roleEditor)[1]
		for i := 0; i < 12; i++ {
			wantStatus(t, d.c.do("POST", d.base, body), 201)
		}
	})
	t.Run("deleted monitors do not count", func(t *testing.T) {
		e.plan(small)
		d := e.doors(e.org("small"), roleEditor)[0]
		first := d.create(t, body)
		d.create(t, body)
		want(t, d.c.do("POST", d.base, body), 402, bodyMonitorQuota)
		want(t, d.c.do("DELETE", d.base+"/"+first.ID, ""), 204, "")
		wantStatus(t, d.c.do("POST", d.base, body), 201)
	})
	t.Run("other orgs' monitors do not count", func(t *testing.T) {
		e.plan(small)
		a, b := e.doors(e.org("small"), roleEditor)[1], e.doors(e.org("small"), roleEditor)[1]
		a.create(t, body)
		a.create(t, body)
		b.create(t, body)
		b.create(t, body)
	})
}

func TestConcurrentCreatesNeverExceedTheCap(t *testing.T) {
	e := newTestEnv(t)
	const limit, racers, rounds = 5, 8, 6
	e.plan(planRecord{Name: "five", APIRateLimit: 60, MaxMonitors: limit, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}})
	body := `{"name":"n","type":"http","target":"https://example.com"}`

	for round := range rounds {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			org := e.org("five")
			doors := e.doors(org, roleEditor)
			for i := 0; i < limit-1; i++ {
				doors[1].create(t, body)
			}
			// Both doors at once, and more racers than the one free slot.
			var wg sync.WaitGroup
			statuses := make(chan int, racers)
			start := make(chan struct{})
			for i := range racers {
				d := doors[i%2]
				wg.Go(func() {
					<-start
					statuses <- d.c.do("POST", d.base, body).status
				})
			}
			close(start)
			wg.Wait()
			close(statuses)
			counts := map[int]int{}
			for s := range statuses {
				counts[s]++
			}
			if counts[http.StatusCreated] != 1 || counts[http.StatusPaymentRequired] != racers-1 {
				t.Errorf("statuses = %v, want exactly one 201 and %d 402", counts, racers-1)
			}
			if n := scalar[int](e, `SELECT count(*) FROM monitors WHERE org_id = $1 AND deleted_at IS NULL`, org); n != limit {
				t.Errorf("live monitors = %d, want %d", n, limit)
			}
		})
	}
}

func TestPatchGatesOnlyTheFieldsItSets(t *testing.T) {
	e := newTestEnv(t)
	e.plan(small)
	org := e.org("enterprise")
	doors := e.doors(org, roleEditor)
	var ids []string
	for _, d := range doors {
		for range 2 {
			m := d.create(t, `{"name":"n","type":"dns","target":"example.com","interval_seconds":10,"locations":["us-west","ap-southeast"]}`)
			ids = append(ids, m.ID)
		}
	}
	// The org moves to a smaller plan: its four monitors now break every gate, and it
	// is over its count.
	e.setPlan(org, "small")

	for i, d := range doors {
		id := ids[2*i]
		for _, tc := range []struct {
			name, patch string
			status      int
			want        string
		}{
			{"rename", `{"name":"renamed"}`, 200, ""},
			{"pause", `{"paused":true}`, 200, ""},
			{"retarget", `{"target":"example.org"}`, 200, ""},
			{"config", `{"config":{"a":1},"assertions":[]}`, 200, ""},
			{"interval below the minimum", `{"interval_seconds":30}`, 402, bodyIntervalQuota},
			{"interval before locations", `{"interval_seconds":30,"locations":["us-west"]}`, 402, bodyIntervalQuota},
			{"locations the plan lacks", `{"locations":["us-east","ap-southeast"]}`, 403, bodyLocationGated("ap-southeast")},
			{"locations before type", `{"locations":["us-west"],"type":"dns"}`, 403, bodyLocationGated("us-west")},
			{"type the plan lacks", `{"type":"dns"}`, 403, bodyTypeGated("dns")},
			{"interval within the plan", `{"interval_seconds":60}`, 200, ""},
			{"locations within the plan", `{"locations":["eu-west"]}`, 200, ""},
			{"type within the plan", `{"type":"tcp","target":"example.org:53"}`, 200, ""},
		} {
			t.Run(d.name+" "+tc.name, func(t *testing.T) {
				r := d.c.do("PATCH", d.base+"/"+id, tc.patch)
				if tc.want == "" {
					wantStatus(t, r, tc.status)
				} else {
					want(t, r, tc.status, tc.want)
				}
			})
		}
	}
	// Still over the count, the org cannot create.
	for _, d := range doors {
		want(t, d.c.do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com","interval_seconds":60}`), 402, bodyMonitorQuota)
	}
}

func TestPlanGateDecidesInOrder(t *testing.T) {
	p := plan{maxMonitors: 3, minInterval: 60, locations: []string{"us-east", "eu-west"}, checkTypes: []string{"http"}}
	ptr := func(v int) *int { return &v }
	str := func(v string) *string { return &v }
	everything := monitorWrite{intervalSeconds: ptr(10), locations: []string{"us-west"}, typ: str("dns")}
	for _, tc := range []struct {
		name string
		p    plan
		w    monitorWrite
		live int
		want error
	}{
		{"at the cap", p, everything, 3, errMonitorQuota},
		{"over the cap", p, everything, 4, errMonitorQuota},
		{"below the cap, interval next", p, everything, 2, errMinIntervalQuota},
		{"no cap", plan{maxMonitors: -1, minInterval: 60}, everything, 1000, errMinIntervalQuota},
		{"not a create", p, everything, skipMonitorQuota, errMinIntervalQuota},
		{"location next", p, monitorWrite{intervalSeconds: ptr(60), locations: []string{"eu-west", "us-west", "ap-southeast"}, typ: str("dns")}, 0, featureGated("location:us-west")},
		{"type last", p, monitorWrite{intervalSeconds: ptr(60), locations: []string{"eu-west"}, typ: str("dns")}, 0, featureGated("check_type:dns")},
		{"all within the plan", p, monitorWrite{intervalSeconds: ptr(60), locations: []string{"eu-west"}, typ: str("http")}, 2, nil},
		{"fields not set are not gated", p, monitorWrite{name: str("n")}, skipMonitorQuota, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planGate(tc.p, tc.w, tc.live)
			if (got == nil) != (tc.want == nil) || got != nil && *got.(*Error) != *tc.want.(*Error) {
				t.Errorf("planGate = %v, want %v", got, tc.want)
			}
		})
	}
}
