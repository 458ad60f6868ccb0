package httpapi

import (
	"cmp"
	"context"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The dashboard's usage page: the org's requests as a chart by class and a table by
// key. It reads the sums of the rows GET /orgs/{orgId}/usage answers with its default
// range, so both show the same numbers.

// usagePageRanges are the usage page's ranges, by its query parameter range.
var usagePageRanges = map[string]struct{ granularity, words string }{
	"24h": {store.UsageHour, "the last 24 hours, by hour"},
	"30d": {store.UsageDay, "the last 30 days, by day"},
}

// usageView is what the usage page shows.
type usageView struct {
	Range   string // "24h" or "30d"
	Words   string
	APIPath string // the API's read of the same rows
	Chart   usageChart
	Keys    []usageKeyView
	All     classCounts
	Units   int64      // of every key
	Month   *monthView // nil when the plan has no monthly quota
}

// monthView is the month's use of the plan's monthly quota.
type monthView struct {
	Name          string // "2026-11"
	Used, Quota   int64
	Percent       int64 // of the quota used, rounded down
	Spent         bool  // nothing more passes this month
	UsedInMeter   int64 // Used, at most Quota, for the <meter>
	High          int64 // 90 % of Quota: the <meter> warns from there
	ResetsOnWords string
}

// Columns are the headings of the classes' columns of the page's tables.
func (usageView) Columns() []string { return usageColumns() }

// KeyTableWidth is the columns of the key table: the key, the classes, the total and
// the units.
func (usageView) KeyTableWidth() int { return numClasses + 3 }

// usageKeyView is a key's row of the usage page: its requests by class, and their
// units (each request's route cost, summed).
type usageKeyView struct {
	ID, Name, Masked string
	Live             bool
	Counts           classCounts
	Units            int64
}

// pageUsage answers GET /dashboard/orgs/{orgId}/usage?range= for any member: the
// org's requests over the last 24 hours by hour, or with range=30d the last 30 days
// by day. Every live key has a row, and so does every other key with requests in the
// range; the busiest first.
func (s *Server) pageUsage(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.orgPage(r, "Usage")
	if err != nil {
		return err
	}
	rangeName := r.URL.Query().Get("range")
	if rangeName == "" {
		rangeName = "24h"
	}
	pr, ok := usagePageRanges[rangeName]
	if !ok {
		return apperr.Invalid("range", "must be 24h or 30d")
	}
	g := usageGrains[pr.granularity]
	q := store.UsageQuery{OrgID: p.orgID, Granularity: pr.granularity}
	q.From, q.To = usageRange(g, s.now())
	sums, err := s.store.UsageByStart(r.Context(), q)
	if err != nil {
		return err
	}
	keys, all, units, err := s.usageByKey(r.Context(), q)
	if err != nil {
		return err
	}
	month, err := s.monthUse(r.Context(), p.orgID)
	if err != nil {
		return err
	}
	data.Usage = &usageView{
		Range: rangeName, Words: pr.words, Keys: keys, All: all, Units: units, Month: month,
		APIPath: "/orgs/" + p.orgID + "/usage?granularity=" + pr.granularity,
		Chart:   buildUsageChart("Requests of "+data.Org.Name+" over "+pr.words+" (UTC)", q.From, q.To, g, sums),
	}
	s.render(w, http.StatusOK, "usage", data)
	return nil
}

// monthUse returns the use of orgID's monthly quota in the current UTC month, as the
// usage record has it (keystore's MonthUsed: the units of the requests that passed
// every budget), or nil when its plan has no quota.
func (s *Server) monthUse(ctx context.Context, orgID string) (*monthView, error) {
	b, err := s.store.PlanBudgets(ctx, orgID)
	if err != nil || b.APIRequestsPerMonth <= 0 {
		return nil, err
	}
	now := s.now().UTC()
	used, err := s.keys.MonthUsed(ctx, orgID, now)
	if err != nil {
		return nil, err
	}
	next := time.Date(now.Year(), now.Month()+1, 1, 0, 0, 0, 0, time.UTC)
	return &monthView{
		Name: now.Format("2006-01"), Used: used, Quota: b.APIRequestsPerMonth,
		Percent: used * 100 / b.APIRequestsPerMonth, Spent: used >= b.APIRequestsPerMonth,
		UsedInMeter: min(used, b.APIRequestsPerMonth), High: b.APIRequestsPerMonth * 9 / 10, ResetsOnWords: next.Format("2 January 2006"),
	}, nil
}

// usageByKey returns the rows of the usage page's key table for q, and the sums of
// every key: requests by class, and units.
func (s *Server) usageByKey(ctx context.Context, q store.UsageQuery) ([]usageKeyView, classCounts, int64, error) {
	sums, err := s.store.UsageByKey(ctx, q)
	if err != nil {
		return nil, classCounts{}, 0, err
	}
	recs, err := s.keys.List(ctx, q.OrgID)
	if err != nil {
		return nil, classCounts{}, 0, err
	}
	byKey := map[string]*usageKeyView{}
	var all classCounts
	var allUnits int64
	for _, u := range sums {
		if byKey[u.KeyID] == nil {
			byKey[u.KeyID] = new(usageKeyView)
		}
		byKey[u.KeyID].Counts[usageClass(u.Outcome, u.Status)] += u.Count
		byKey[u.KeyID].Units += u.Units
		all[usageClass(u.Outcome, u.Status)] += u.Count
		allUnits += u.Units
	}
	var rows []usageKeyView
	now := s.now()
	for _, rec := range recs {
		kv := s.keyView(rec, now)
		sum, used := byKey[rec.ID]
		delete(byKey, rec.ID)
		if !used && !kv.Live {
			continue
		}
		row := usageKeyView{ID: rec.ID, Name: rec.Name, Masked: kv.Masked, Live: kv.Live}
		if used {
			row.Counts, row.Units = sum.Counts, sum.Units
		}
		rows = append(rows, row)
	}
	// Usage rows outlive keys: a key no longer listed keeps its row.
	for id, sum := range byKey {
		rows = append(rows, usageKeyView{ID: id, Name: "(a key no longer listed)", Masked: s.format.Mask(id),
			Counts: sum.Counts, Units: sum.Units})
	}
	slices.SortFunc(rows, func(a, b usageKeyView) int {
		return cmp.Or(cmp.Compare(b.Counts.Total(), a.Counts.Total()), strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID))
	})
	return rows, all, allUnits, nil
}

// keyRequests returns the requests of each key of orgID over the usage page's default
// range, the last 24 hours, by key id.
func (s *Server) keyRequests(ctx context.Context, orgID string) (map[string]int64, error) {
	q := store.UsageQuery{OrgID: orgID, Granularity: store.UsageHour}
	q.From, q.To = usageRange(usageGrains[store.UsageHour], s.now())
	sums, err := s.store.UsageByKey(ctx, q)
	if err != nil {
		return nil, err
	}
	n := map[string]int64{}
	for _, u := range sums {
		n[u.KeyID] += u.Count
	}
	return n, nil
}
