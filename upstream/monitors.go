package upstream

import (
	"net/http"
	"strconv"
)

// Page sizes of the monitor list.
const (
	defaultPageSize = 50
	maxPageSize     = 200
)

// The monitor routes below are one implementation behind two doors (routes): each
// receives the principal its door authenticated, and every query is confined to that
// principal's organisation, so a foreign monitor is as absent as a missing one.

// handleListMonitors answers GET …/monitors?limit=&cursor=: 200
// {"data":[monitor…],"next_cursor":string or null}. An empty limit or cursor counts as
// absent.
func (s *Server) handleListMonitors(w http.ResponseWriter, r *http.Request, p principal) {
	q := r.URL.Query()
	limit := defaultPageSize
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxPageSize {
			s.writeError(w, r, invalid("limit", "must be an integer from 1 to %d", maxPageSize))
			return
		}
		limit = n
	}
	var after *cursor
	if v := q.Get("cursor"); v != "" {
		c, err := decodeCursor(v)
		if err != nil {
			s.writeError(w, r, err)
			return
		}
		after = &c
	}
	ms, next, err := s.listMonitors(r.Context(), p.orgID, limit, after)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	page := struct {
		Data       []monitor `json:"data"`
		NextCursor *string   `json:"next_cursor"`
	}{Data: ms}
	if ms == nil {
		page.Data = []monitor{}
	}
	if next != nil {
		c := next.encode()
		page.NextCursor = &c
	}
	writeJSON(w, http.StatusOK, page)
}

// handleCreateMonitor answers POST …/monitors: 201 with the monitor, after the body
// (400, 413) and the plan's gates (402, 403).
func (s *Server) handleCreateMonitor(w http.ResponseWriter, r *http.Request, p principal) {
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	in, err := decodeMonitorWrite(body)
	if err == nil {
		in, err = in.forCreate()
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	m, err := s.createMonitor(r.Context(), p.orgID, in)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, m)
}

// handleGetMonitor answers GET …/monitors/{id}: 200 with the monitor.
func (s *Server) handleGetMonitor(w http.ResponseWriter, r *http.Request, p principal) {
	id := r.PathValue("id")
	if !validUUID(id) {
		s.writeError(w, r, errMonitorNotFound)
		return
	}
	m, err := s.getMonitor(r.Context(), p.orgID, id)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// handlePatchMonitor answers PATCH …/monitors/{id}: 200 with the monitor. A malformed
// id is 404 before the body is read; then come the body (400, 413), the monitor (404),
// the target's fit to the type (400) and the gates of the fields the body sets.
func (s *Server) handlePatchMonitor(w http.ResponseWriter, r *http.Request, p principal) {
	id := r.PathValue("id")
	if !validUUID(id) {
		s.writeError(w, r, errMonitorNotFound)
		return
	}
	body, err := readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	in, err := decodeMonitorWrite(body)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	m, err := s.patchMonitor(r.Context(), p.orgID, id, in)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, m)
}

// handleDeleteMonitor answers DELETE …/monitors/{id}: 204; the monitor is kept,
// marked deleted, and is not found from then on.
func (s *Server) handleDeleteMonitor(w http.ResponseWriter, r *http.Request, p principal) {
	id := r.PathValue("id")
	if !validUUID(id) {
		s.writeError(w, r, errMonitorNotFound)
		return
	}
	if err := s.deleteMonitor(r.Context(), p.orgID, id); err != nil {
		s.writeError(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
