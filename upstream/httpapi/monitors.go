package httpapi

import (
	"net/http"
	"strconv"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// Page sizes of the monitor list.
const (
	defaultPageSize = 50
	maxPageSize     = 200
)

// pageLimit parses a list's limit query parameter: 1 to maxPageSize, or
// defaultPageSize when empty.
func pageLimit(v string) (int, error) {
	if v == "" {
		return defaultPageSize, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxPageSize {
		return 0, apperr.Invalid("limit", "must be an integer from 1 to %d", maxPageSize)
	}
	return n, nil
}

// The monitor routes serve both doors (routes). Each receives the principal its door
// authenticated. Every query is confined to that principal's organisation, so a
// foreign monitor is as absent as a missing one.

// handleListMonitors answers GET …/monitors?limit=&cursor= with 200
// {"data":[monitor…],"next_cursor":string or null}. An empty limit or cursor counts as
// absent.
func (s *Server) handleListMonitors(w http.ResponseWriter, r *http.Request, p principal) error {
	q := r.URL.Query()
	limit, err := pageLimit(q.Get("limit"))
	if err != nil {
		return err
	}
	var after *store.Cursor
	if v := q.Get("cursor"); v != "" {
		c, err := store.DecodeCursor(v)
		if err != nil {
			return err
		}
		after = &c
	}
	ms, next, err := s.store.ListMonitors(r.Context(), p.orgID, limit, after)
	if err != nil {
		return err
	}
	page := struct {
		Data       []store.Monitor `json:"data"`
		NextCursor *string         `json:"next_cursor"`
	}{Data: ms}
	if ms == nil {
		page.Data = []store.Monitor{}
	}
	if next != nil {
		c := next.Encode()
		page.NextCursor = &c
	}
	writeJSON(w, http.StatusOK, page)
	return nil
}

// handleCreateMonitor answers POST …/monitors with 201 and the monitor. The body comes
// first (400, 413), then the plan's gates (402, 403).
func (s *Server) handleCreateMonitor(w http.ResponseWriter, r *http.Request, p principal) error {
	in, err := readMonitorWrite(w, r)
	if err == nil {
		in, err = in.ForCreate()
	}
	if err != nil {
		return err
	}
	m, err := s.store.CreateMonitor(r.Context(), p.orgID, in)
	return writeMonitor(w, http.StatusCreated, m, err)
}

// readMonitorWrite reads r's body (413) and decodes it as a monitor write (400).
func readMonitorWrite(w http.ResponseWriter, r *http.Request) (store.MonitorWrite, error) {
	body, err := readBody(w, r)
	if err != nil {
		return store.MonitorWrite{}, err
	}
	return decodeMonitorWrite(body)
}

// writeMonitor answers with m and status. It returns err instead, the error of the
// store call that gave m, if there is one.
func writeMonitor(w http.ResponseWriter, status int, m store.Monitor, err error) error {
	if err != nil {
		return err
	}
	writeJSON(w, status, m)
	return nil
}

// monitorHandler is a route on the monitor of the path's {id}. monitorRoute has
// checked id.
type monitorHandler func(w http.ResponseWriter, r *http.Request, p principal, id string) error

// monitorRoute adapts h to a principalHandler. A path's {id} that is not a UUID is
// apperr.ErrMonitorNotFound, before anything else is read.
func monitorRoute(h monitorHandler) principalHandler {
	return func(w http.ResponseWriter, r *http.Request, p principal) error {
		id := r.PathValue("id")
		if !store.ValidUUID(id) {
			return apperr.ErrMonitorNotFound
		}
		return h(w, r, p, id)
	}
}

// handleGetMonitor answers GET …/monitors/{id} with 200 and the monitor.
func (s *Server) handleGetMonitor(w http.ResponseWriter, r *http.Request, p principal, id string) error {
	m, err := s.store.GetMonitor(r.Context(), p.orgID, id)
	return writeMonitor(w, http.StatusOK, m, err)
}

// handlePatchMonitor answers PATCH …/monitors/{id} with 200 and the monitor. After the
// id (monitorRoute) come the body (400, 413) and the monitor (404). Then come the
// target's fit to the type (400) and the gates of the fields the body sets.
func (s *Server) handlePatchMonitor(w http.ResponseWriter, r *http.Request, p principal, id string) error {
	in, err := readMonitorWrite(w, r)
	if err != nil {
		return err
	}
	m, err := s.store.PatchMonitor(r.Context(), p.orgID, id, in)
	return writeMonitor(w, http.StatusOK, m, err)
}

// handleDeleteMonitor answers DELETE …/monitors/{id} with 204. The monitor is kept but
// marked deleted, and it is not found from then on.
func (s *Server) handleDeleteMonitor(w http.ResponseWriter, r *http.Request, p principal, id string) error {
	if err := s.store.DeleteMonitor(r.Context(), p.orgID, id); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
