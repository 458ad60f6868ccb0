package httpapi

import (
	"encoding/base64"
	"net/http"
	"strconv"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
)

// eventJSON is one audit event. key_id appears on the key.* actions, webhook_id on the
// webhook.* ones, new_key_id on key.rolled, url on key.leaked, changes on key.updated
// and org.plan_changed.
type eventJSON struct {
	ID        string            `json:"id"`
	Action    string            `json:"action"`
	KeyID     string            `json:"key_id,omitempty"`
	WebhookID string            `json:"webhook_id,omitempty"`
	Actor     string            `json:"actor"`
	NewKeyID  string            `json:"new_key_id,omitempty"`
	URL       string            `json:"url,omitempty"`
	Changes   *keystore.Changes `json:"changes,omitempty"`
	At        string            `json:"at"`
}

// handleListAuditEvents answers GET /orgs/{orgId}/audit-events?limit=&cursor= with
// 200 {"data":[event…],"next_cursor":string or null}, newest first. An empty limit or
// cursor counts as absent.
func (s *Server) handleListAuditEvents(w http.ResponseWriter, r *http.Request, p principal) error {
	limit, before, err := cursorQuery(r)
	if err != nil {
		return err
	}
	events, err := s.keys.Events(r.Context(), p.orgID, before, limit+1)
	if err != nil {
		return err
	}
	writeCursorPage(w, events, limit, func(e keystore.Event) int64 { return e.ID }, toEventJSON)
	return nil
}

// cursorQuery reads a cursor-paged list's limit and cursor: the page size, and the id
// the page starts below (0: the newest first).
func cursorQuery(r *http.Request) (limit int, before int64, err error) {
	q := r.URL.Query()
	if limit, err = pageLimit(q.Get("limit")); err != nil {
		return 0, 0, err
	}
	if v := q.Get("cursor"); v != "" {
		if before, err = decodeEventCursor(v); err != nil {
			return 0, 0, err
		}
	}
	return limit, before, nil
}

// writeCursorPage answers 200 {"data":[…],"next_cursor":string or null} with items,
// read one past limit: the first limit of them through toJSON, and the cursor of the
// last of those when there were more.
func writeCursorPage[T, J any](w http.ResponseWriter, items []T, limit int, id func(T) int64, toJSON func(T) J) {
	page := struct {
		Data       []J     `json:"data"`
		NextCursor *string `json:"next_cursor"`
	}{Data: make([]J, 0, min(len(items), limit))}
	if len(items) > limit {
		items = items[:limit]
		c := encodeEventCursor(id(items[limit-1]))
		page.NextCursor = &c
	}
	for _, it := range items {
		page.Data = append(page.Data, toJSON(it))
	}
	writeJSON(w, http.StatusOK, page)
}

// toEventJSON is e as both doors show it.
func toEventJSON(e keystore.Event) eventJSON {
	return eventJSON{
		ID:        strconv.FormatInt(e.ID, 10),
		Action:    e.Action,
		KeyID:     e.KeyID,
		WebhookID: e.WebhookID,
		Actor:     e.Actor,
		NewKeyID:  e.NewKeyID,
		URL:       e.URL,
		Changes:   e.Changes,
		At:        timeJSON(e.At),
	}
}

// encodeEventCursor returns the cursor of the page after the event id. It is the
// base64url text of "e<id>", opaque to clients.
func encodeEventCursor(id int64) string {
	return base64.RawURLEncoding.EncodeToString([]byte("e" + strconv.FormatInt(id, 10)))
}

// decodeEventCursor is the inverse of encodeEventCursor. Anything else is an
// apperr.EINVALID error naming "cursor".
func decodeEventCursor(s string) (int64, error) {
	bad := apperr.Invalid("cursor", "is not a cursor this API returned")
	raw, err := base64.RawURLEncoding.Strict().DecodeString(s)
	if err != nil || len(raw) < 2 || raw[0] != 'e' {
		return 0, bad
	}
	id, err := strconv.ParseInt(string(raw[1:]), 10, 64)
	if err != nil || id < 1 || strconv.FormatInt(id, 10) != string(raw[1:]) {
		return 0, bad
	}
	return id, nil
}
