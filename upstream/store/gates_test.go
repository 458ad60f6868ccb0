package store

import (
	"testing"

	"github.com/keygate/keygate/upstream/apperr"
)

func TestPlanGateDecidesInOrder(t *testing.T) {
	p := planLimits{maxMonitors: 3, minInterval: 60, locations: []string{"us-east", "eu-west"}, checkTypes: []string{"http"}}
	ptr := func(v int) *int { return &v }
	str := func(v string) *string { return &v }
	everything := MonitorWrite{IntervalSeconds: ptr(10), Locations: []string{"us-west"}, Type: str("dns")}
	for _, tc := range []struct {
		name string
		p    planLimits
		w    MonitorWrite
		live int
		want error
	}{
		{"at the cap", p, everything, 3, apperr.ErrMonitorQuota},
		{"over the cap", p, everything, 4, apperr.ErrMonitorQuota},
		{"below the cap, interval next", p, everything, 2, apperr.ErrMinIntervalQuota},
		{"no cap", planLimits{maxMonitors: -1, minInterval: 60}, everything, 1000, apperr.ErrMinIntervalQuota},
		{"not a create", p, everything, skipMonitorQuota, apperr.ErrMinIntervalQuota},
		{"location next", p, MonitorWrite{IntervalSeconds: ptr(60), Locations: []string{"eu-west", "us-west", "ap-southeast"}, Type: str("dns")}, 0, apperr.FeatureGated("location:us-west")},
		{"type last", p, MonitorWrite{IntervalSeconds: ptr(60), Locations: []string{"eu-west"}, Type: str("dns")}, 0, apperr.FeatureGated("check_type:dns")},
		{"all within the plan", p, MonitorWrite{IntervalSeconds: ptr(60), Locations: []string{"eu-west"}, Type: str("http")}, 2, nil},
		{"fields not set are not gated", p, MonitorWrite{Name: str("n")}, skipMonitorQuota, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := planGate(tc.p, tc.w, tc.live)
			if (got == nil) != (tc.want == nil) || got != nil && *got.(*apperr.Error) != *tc.want.(*apperr.Error) {
				t.Errorf("planGate = %v, want %v", got, tc.want)
			}
		})
	}
}
