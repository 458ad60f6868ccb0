package httpapi

import (
	"net/http"
)

// auditPageSize is the number of audit events on one page of the dashboard's trail.
const auditPageSize = 50

// pageAudit answers GET /dashboard/orgs/{orgId}/audit?cursor= with the audit trail,
// newest first, a page at a time. It reads the events as GET
// /orgs/{orgId}/audit-events does.
func (s *Server) pageAudit(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.managerPage(r, "Audit trail")
	if err != nil {
		return err
	}
	var before int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		if before, err = decodeEventCursor(v); err != nil {
			return err
		}
	}
	events, err := s.keys.Events(r.Context(), p.orgID, before, auditPageSize+1)
	if err != nil {
		return err
	}
	if len(events) > auditPageSize {
		events = events[:auditPageSize]
		data.NextCursor = encodeEventCursor(events[auditPageSize-1].ID)
	}
	for _, e := range events {
		j := toEventJSON(e)
		data.Events = append(data.Events, eventView{
			At: pageTime(&e.At, ""), Action: j.Action, KeyID: j.KeyID, NewKeyID: j.NewKeyID,
			URL: j.URL, Actor: j.Actor,
		})
	}
	s.render(w, http.StatusOK, "audit", data)
	return nil
}
