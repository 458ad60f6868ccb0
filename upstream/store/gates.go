package store

import (
	"slices"

	"github.com/keygate/keygate/upstream/apperr"
)

// planLimits is the part of an organisation's plan that gates monitor writes.
type planLimits struct {
	// maxMonitors is the number of live monitors allowed. -1 means no cap.
	maxMonitors int
	// minInterval is the smallest interval_seconds allowed.
	minInterval int
	// locations are the probe locations the plan includes.
	locations []string
	// checkTypes are the monitor types the plan includes.
	checkTypes []string
}

// skipMonitorQuota is planGate's liveMonitors for a write that adds no monitor. The
// count gate does not apply to it.
const skipMonitorQuota = -1

// planGate is the one place the plan gates are decided, for both doors
// (openapi/v1.yaml). It runs after the body is found valid. It returns the first gate w
// fails, in this order:
//
//  1. monitor count (creates only: liveMonitors is the org's count of live monitors,
//     or skipMonitorQuota): 402 quota_exceeded "monitors";
//  2. minimum interval: 402 quota_exceeded "min_interval_seconds";
//  3. probe locations, the first in w's order the plan lacks: 403 feature_gated
//     "location:<name>";
//  4. check type: 403 feature_gated "check_type:<type>".
//
// Only the fields w sets are gated. So a PATCH may rename a monitor of an organisation
// that has since moved to a smaller plan. A create sets every field, defaults included,
// and is gated on all of them.
func planGate(p planLimits, w MonitorWrite, liveMonitors int) error {
	if liveMonitors != skipMonitorQuota && p.maxMonitors >= 0 && liveMonitors >= p.maxMonitors {
		return apperr.ErrMonitorQuota
	}
	if w.IntervalSeconds != nil && *w.IntervalSeconds < p.minInterval {
		return apperr.ErrMinIntervalQuota
	}
	for _, loc := range w.Locations {
		if !slices.Contains(p.locations, loc) {
			return apperr.FeatureGated("location:" + loc)
		}
	}
	if w.Type != nil && !slices.Contains(p.checkTypes, *w.Type) {
		return apperr.FeatureGated("check_type:" + *w.Type)
	}
	return nil
}
