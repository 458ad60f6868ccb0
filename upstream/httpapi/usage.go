package httpapi

import (
	"bytes"
	"context"
	"encoding/csv"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// maxUsageRows is the most rows one answer of GET /orgs/{orgId}/usage holds. A range
// with more is refused, to be read in parts (by from and to, or key_id).
const maxUsageRows = 100_000

// usageRowJSON is a row of the usage record.
type usageRowJSON struct {
	KeyID   string `json:"key_id"`
	Start   string `json:"start"`
	Outcome string `json:"outcome"`
	Status  int    `json:"status"`
	Count   int64  `json:"count"`
	Units   int64  `json:"units"`
}

// handleUsage answers GET /orgs/{orgId}/usage?from=&to=&granularity=&key_id=&format=
// with the org's usage record, as JSON {"granularity","from","to","data":[row…]} or
// as CSV with the header line key_id,start,outcome,status,count,units. Any member may
// read it. A key_id that is not one of the org's keys is 404, like a foreign org.
func (s *Server) handleUsage(w http.ResponseWriter, r *http.Request, p principal) error {
	in, err := decodeUsageQuery(r.URL.Query(), r.Header.Values("Accept"), s.now())
	if err != nil {
		return err
	}
	if in.KeyID != "" {
		if err := s.store.OrgKey(r.Context(), p.orgID, in.KeyID); err != nil {
			return err
		}
	}
	rows, more, err := s.store.Usage(r.Context(), in.query(p.orgID), maxUsageRows)
	if err != nil {
		return err
	}
	if more {
		return apperr.Invalid("to", "the range holds more than %d rows: read it in parts (from, to, key_id) or with a coarser granularity", maxUsageRows)
	}
	// The answer depends on Accept, unless format chose.
	w.Header().Set("Vary", "Accept")
	if in.CSV {
		writeUsageCSV(w, usageCSVName(p.orgID, in), rows)
		return nil
	}
	data := make([]usageRowJSON, 0, len(rows))
	for _, u := range rows {
		data = append(data, usageRowJSON{KeyID: u.KeyID, Start: timeJSON(u.Start), Outcome: u.Outcome, Status: u.Status, Count: u.Count, Units: u.Units})
	}
	writeJSON(w, http.StatusOK, struct {
		Granularity string         `json:"granularity"`
		From        string         `json:"from"`
		To          string         `json:"to"`
		Data        []usageRowJSON `json:"data"`
	}{in.Granularity, timeJSON(in.From), timeJSON(in.To), data})
	return nil
}

// writeUsageCSV answers with rows as CSV, to be saved as name.
func writeUsageCSV(w http.ResponseWriter, name string, rows []store.UsageRow) {
	records := [][]string{{"key_id", "start", "outcome", "status", "count", "units"}}
	for _, u := range rows {
		records = append(records, []string{u.KeyID, timeJSON(u.Start), u.Outcome, strconv.Itoa(u.Status),
			strconv.FormatInt(u.Count, 10), strconv.FormatInt(u.Units, 10)})
	}
	writeCSV(w, name, records)
}

// writeCSV answers with records, its header line first, as CSV (RFC 4180: CRLF line
// ends), a download to be saved as name.
func writeCSV(w http.ResponseWriter, name string, records [][]string) {
	var buf bytes.Buffer
	cw := csv.NewWriter(&buf)
	cw.UseCRLF = true
	_ = cw.WriteAll(records) // a bytes.Buffer takes every write
	h := w.Header()
	h.Set("Content-Type", "text/csv; charset=utf-8")
	h.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
}

// DefaultUsageRollupInterval is how often serve rolls the usage record up, unless
// --usage-rollup-interval says otherwise.
const DefaultUsageRollupInterval = time.Minute

// RunUsageRollup rolls the usage record's minutes up into hours and days, then
// deletes what it no longer keeps (store.PurgeUsage). It runs every interval until
// ctx ends. A failure is logged and tried again at the next tick; reads stay exact
// meanwhile, since they add what is not rolled up yet. Instances rolling up at once
// only find less to do.
func (s *Server) RunUsageRollup(ctx context.Context, interval time.Duration) {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		s.rollUpUsage(ctx)
	}
}

// rollUpUsage runs one roll-up and purge of the usage record.
func (s *Server) rollUpUsage(ctx context.Context) {
	rolled, err := s.store.RollUpUsage(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("usage roll-up failed", zap.Error(err))
		}
		return
	}
	minutes, hours, flushes, err := s.store.PurgeUsage(ctx, s.now())
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Warn("usage purge failed", zap.Error(err))
		}
		return
	}
	// Every minute with traffic rolls rows up: a line each time would flood the log.
	s.logger.Debug("usage rolled up", zap.Int64("minute_rows", rolled),
		zap.Int64("purged_minute_rows", minutes), zap.Int64("purged_hour_rows", hours),
		zap.Int64("purged_write_ids", flushes))
}
