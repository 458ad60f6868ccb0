package httpapi

import (
	"fmt"
	"maps"
	"mime"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The input of GET /orgs/{orgId}/usage: its query and its Accept header. The
// dashboard's usage page reads the same ranges (usageRange).

// usageInput is what a read of the usage record takes.
type usageInput struct {
	Granularity string
	From, To    time.Time
	KeyID       string // "": every key of the org
	CSV         bool
}

// query is in as a store query of orgID's record.
func (in usageInput) query(orgID string) store.UsageQuery {
	return store.UsageQuery{OrgID: orgID, KeyID: in.KeyID, Granularity: in.Granularity, From: in.From, To: in.To}
}

// usageGrain is what a granularity allows: its unit, to which from and to are aligned
// (in UTC), the span read when neither is given, and the longest span.
type usageGrain struct {
	unit, span, maxSpan time.Duration
	// aligned and most say the unit and the longest span in words.
	aligned, most string
}

const usageDay = 24 * time.Hour

// usageGrains are the granularities, by name.
var usageGrains = map[string]usageGrain{
	store.UsageMinute: {time.Minute, time.Hour, 48 * time.Hour, "a whole minute", "48 hours"},
	store.UsageHour:   {time.Hour, 24 * time.Hour, 400 * usageDay, "a whole hour (UTC)", "400 days"},
	store.UsageDay:    {usageDay, 30 * usageDay, 800 * usageDay, "a UTC midnight", "800 days"},
}

// usageParams are the query parameters GET /orgs/{orgId}/usage knows.
var usageParams = []string{"from", "to", "granularity", "key_id", "format"}

// usageRange returns the default range of granularity g as of now: the span of g
// that ends with the current unit, which it includes.
func usageRange(g usageGrain, now time.Time) (from, to time.Time) {
	to = now.UTC().Truncate(g.unit).Add(g.unit)
	return to.Add(-g.span), to
}

// decodeUsageQuery decodes the query q and the Accept header values accept of a read
// of the usage record, as of now. An empty parameter counts as absent. A parameter
// it does not know, or one given twice, is an error naming it: a misspelt parameter
// would otherwise answer something else than what was asked.
func decodeUsageQuery(q url.Values, accept []string, now time.Time) (usageInput, error) {
	for _, name := range slices.Sorted(maps.Keys(q)) {
		switch {
		case !slices.Contains(usageParams, name):
			return usageInput{}, apperr.Invalid(name, "unknown parameter; the parameters are %s", strings.Join(usageParams, ", "))
		case len(q[name]) > 1:
			return usageInput{}, apperr.Invalid(name, "given more than once")
		}
	}
	in := usageInput{Granularity: q.Get("granularity"), KeyID: q.Get("key_id")}
	if in.Granularity == "" {
		in.Granularity = store.UsageHour
	}
	g, ok := usageGrains[in.Granularity]
	if !ok {
		return usageInput{}, apperr.Invalid("granularity", "must be minute, hour or day")
	}
	var err error
	if in.From, in.To, err = decodeUsageRange(q.Get("from"), q.Get("to"), g, in.Granularity, now); err != nil {
		return usageInput{}, err
	}
	if in.KeyID != "" && !keystore.ValidKeyID(in.KeyID) {
		return usageInput{}, apperr.Invalid("key_id", "is not a key id")
	}
	switch q.Get("format") {
	case "":
		in.CSV = acceptsCSV(accept)
	case "csv":
		in.CSV = true
	case "json":
	default:
		return usageInput{}, apperr.Invalid("format", "must be json or csv")
	}
	return in, nil
}

// decodeUsageRange decodes from and to for granularity g, named name. Without from,
// the range is g's span before to; without to, it ends with the current unit.
func decodeUsageRange(fromText, toText string, g usageGrain, name string, now time.Time) (from, to time.Time, err error) {
	from, to = usageRange(g, now)
	if toText != "" {
		if to, err = usageTime("to", toText, g); err != nil {
			return
		}
		from = to.Add(-g.span)
	}
	if fromText != "" {
		if from, err = usageTime("from", fromText, g); err != nil {
			return
		}
	}
	switch {
	case !to.After(from):
		err = apperr.Invalid("to", "must be after from")
	case to.Sub(from) > g.maxSpan:
		err = apperr.Invalid("to", "must be at most %s after from with granularity %s", g.most, name)
	}
	return from, to, err
}

// usageTime parses the parameter name, an RFC 3339 time aligned to g's unit.
func usageTime(name, text string, g usageGrain) (time.Time, error) {
	t, err := time.Parse(time.RFC3339, text)
	if err != nil {
		return time.Time{}, apperr.Invalid(name, "must be an RFC 3339 time such as 2026-03-14T15:00:00Z (in a URL, + is %%2B)")
	}
	t = t.UTC()
	if !t.Truncate(g.unit).Equal(t) {
		return time.Time{}, apperr.Invalid(name, "must be %s", g.aligned)
	}
	return t, nil
}

// acceptsCSV reports whether the Accept header values ask for text/csv: it is the
// first of the media ranges that the answer may take (text/csv, application/json,
// application/*, text/*, */*) with a quality above 0.
func acceptsCSV(accept []string) bool {
	for _, v := range accept {
		for _, item := range strings.Split(v, ",") {
			media, params, err := mime.ParseMediaType(strings.TrimSpace(item))
			if err != nil {
				continue
			}
			if q, err := strconv.ParseFloat(params["q"], 64); err == nil && q <= 0 {
				continue
			}
			switch media {
			case "text/csv":
				return true
			case "application/json", "application/*", "text/*", "*/*":
				return false
			}
		}
	}
	return false
}

// usageCSVName is the file name of a CSV answer.
func usageCSVName(orgID string, in usageInput) string {
	return fmt.Sprintf("usage-%s-%s-%s.csv", orgID, in.Granularity, in.From.Format("20060102T1504Z"))
}
