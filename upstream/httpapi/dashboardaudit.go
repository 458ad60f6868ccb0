package httpapi

import (
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/keygate/keygate/keystore"
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
			URL: j.URL, Actor: j.Actor, Changes: changesWords(e.Changes),
		})
	}
	s.render(w, http.StatusOK, "audit", data)
	return nil
}

// changesWords says what a key.updated changed, each setting before and after:
// "rate limit: plan's → 25 a minute; allowed networks: anywhere → 192.0.2.0/24;
// scopes: all the role allows → monitors:read".
func changesWords(c *keystore.Changes) string {
	if c == nil {
		return ""
	}
	var parts []string
	if rl := c.RateLimit; rl != nil {
		parts = append(parts, "rate limit: "+limitWords(rl.From)+" → "+limitWords(rl.To))
	}
	if nets := c.AllowedCIDRs; nets != nil {
		parts = append(parts, "allowed networks: "+networksWords(nets.From)+" → "+networksWords(nets.To))
	}
	if sc := c.Scopes; sc != nil {
		parts = append(parts, "scopes: "+scopesWords(sc.From)+" → "+scopesWords(sc.To))
	}
	return strings.Join(parts, "; ")
}

func limitWords(n *int) string {
	if n == nil {
		return "plan's"
	}
	return strconv.Itoa(*n) + " a minute"
}

func scopesWords(list []string) string {
	if list == nil {
		return "all the role allows"
	}
	return strings.Join(list, ", ")
}

func networksWords(list []netip.Prefix) string {
	if len(list) == 0 {
		return "anywhere"
	}
	s := make([]string, len(list))
	for i, p := range list {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
