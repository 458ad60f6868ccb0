package httpapi_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/keygate/keygate/upstream/internal/upstreamtest"
	"github.com/keygate/keygate/upstream/store"
)

// The bodies of the plan gates (openapi/v1.yaml).
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
var small = store.Plan{Name: "small", APIRateLimit: 60, MaxMonitors: 2, MinIntervalSeconds: 60,
	Locations: []string{"us-east", "eu-west"}, CheckTypes: []string{"http", "tcp"}}

func TestCreateGatesApplyInOrderWithIdenticalBodiesOnBothDoors(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	e.Plan(small)
	full, roomy := e.Org("small"), e.Org("small")
	fill := doors(e, full, store.RoleEditor)[1]
	fill.create(t, `{"name":"1","type":"http","target":"https://example.com"}`)
	fill.create(t, `{"name":"2","type":"http","target":"https://example.com"}`)

	// Every body fails its own gate and all the later ones. So each case also shows
	// that the earlier gates pass.
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
			for _, d := range doors(e, tc.org, store.RoleEditor) {
				r := d.c.Do("POST", d.base, tc.body)
				upstreamtest.Want(t, r, tc.status, tc.want)
				bodies = append(bodies, r.Body)
			}
			if bodies[0] != bodies[1] {
				t.Errorf("the doors answer differently:\n%s\n%s", bodies[0], bodies[1])
			}
		})
	}
	if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM monitors`); n != 2 {
		t.Errorf("monitors = %d, want only the 2 that filled the org", n)
	}
}

func TestCreateGatesApplyToDefaults(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	e.Plan(store.Plan{Name: "slow", APIRateLimit: 60, MaxMonitors: 5, MinIntervalSeconds: 600,
		Locations: []string{"eu-west"}, CheckTypes: []string{"http"}})
	org := e.Org("slow")
	for _, d := range doors(e, org, store.RoleEditor) {
		// The default interval (300) is below the plan's minimum.
		upstreamtest.Want(t, d.c.Do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com"}`), 402, bodyIntervalQuota)
		// The default location (us-east) is not in the plan.
		upstreamtest.Want(t, d.c.Do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com","interval_seconds":600}`), 403, bodyLocationGated("us-east"))
		upstreamtest.WantStatus(t, d.c.Do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com","interval_seconds":600,"locations":["eu-west"]}`), 201)
	}
}

func TestMonitorCountGate(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	e.Plan(store.Plan{Name: "none", APIRateLimit: 60, MaxMonitors: 0, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}})
	e.Plan(store.Plan{Name: "uncapped", APIRateLimit: 60, MaxMonitors: -1, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}})
	body := `{"name":"n","type":"http","target":"https://example.com"}`

	t.Run("zero allows none", func(t *testing.T) {
		for _, d := range doors(e, e.Org("none"), store.RoleEditor) {
			upstreamtest.Want(t, d.c.Do("POST", d.base, body), 402, bodyMonitorQuota)
		}
	})
	t.Run("-1 is no cap", func(t *testing.T) {
		d := doors(e, e.Org("uncapped"), store.RoleEditor)[1]
		for i := 0; i < 12; i++ {
			upstreamtest.WantStatus(t, d.c.Do("POST", d.base, body), 201)
		}
	})
	t.Run("deleted monitors do not count", func(t *testing.T) {
		e.Plan(small)
		d := doors(e, e.Org("small"), store.RoleEditor)[0]
		first := d.create(t, body)
		d.create(t, body)
		upstreamtest.Want(t, d.c.Do("POST", d.base, body), 402, bodyMonitorQuota)
		upstreamtest.Want(t, d.c.Do("DELETE", d.base+"/"+first.ID, ""), 204, "")
		upstreamtest.WantStatus(t, d.c.Do("POST", d.base, body), 201)
	})
	t.Run("other orgs' monitors do not count", func(t *testing.T) {
		e.Plan(small)
		a, b := doors(e, e.Org("small"), store.RoleEditor)[1], doors(e, e.Org("small"), store.RoleEditor)[1]
		a.create(t, body)
		a.create(t, body)
		b.create(t, body)
		b.create(t, body)
	})
}

func TestConcurrentCreatesNeverExceedTheCap(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	const limit, racers, rounds = 5, 8, 6
	e.Plan(store.Plan{Name: "five", APIRateLimit: 60, MaxMonitors: limit, MinIntervalSeconds: 60,
		Locations: []string{"us-east"}, CheckTypes: []string{"http"}})
	body := `{"name":"n","type":"http","target":"https://example.com"}`

	for round := range rounds {
		t.Run(fmt.Sprintf("round %d", round), func(t *testing.T) {
			org := e.Org("five")
			doors := doors(e, org, store.RoleEditor)
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
					statuses <- d.c.Do("POST", d.base, body).Status
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
			if n := upstreamtest.Scalar[int](e, `SELECT count(*) FROM monitors WHERE org_id = $1 AND deleted_at IS NULL`, org); n != limit {
				t.Errorf("live monitors = %d, want %d", n, limit)
			}
		})
	}
}

func TestPatchGatesOnlyTheFieldsItSets(t *testing.T) {
	e := upstreamtest.NewEnv(t)
	e.Plan(small)
	org := e.Org("enterprise")
	doors := doors(e, org, store.RoleEditor)
	var ids []string
	for _, d := range doors {
		for range 2 {
			m := d.create(t, `{"name":"n","type":"dns","target":"example.com","interval_seconds":10,"locations":["us-west","ap-southeast"]}`)
			ids = append(ids, m.ID)
		}
	}
	// The org moves to a smaller plan. Its four monitors now break every gate, and
	// they are over its count.
	e.SetPlan(org, "small")

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
				r := d.c.Do("PATCH", d.base+"/"+id, tc.patch)
				if tc.want == "" {
					upstreamtest.WantStatus(t, r, tc.status)
				} else {
					upstreamtest.Want(t, r, tc.status, tc.want)
				}
			})
		}
	}
	// Still over the count, the org cannot create.
	for _, d := range doors {
		upstreamtest.Want(t, d.c.Do("POST", d.base, `{"name":"n","type":"http","target":"https://example.com","interval_seconds":60}`), 402, bodyMonitorQuota)
	}
}
