package httpapi

import (
	"context"
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
	keyName, actorName, err := s.auditNames(r.Context(), p.orgID, events)
	if err != nil {
		return err
	}
	for _, e := range events {
		j := toEventJSON(e)
		data.Events = append(data.Events, eventView{
			At: pageTime(&e.At, ""), Action: j.Action, Key: keyName(j.KeyID), URL: j.URL,
			Actor: actorName(j.Actor), Changes: changesWords(e.Changes),
		})
		if j.NewKeyID != "" {
			nk := keyName(j.NewKeyID)
			data.Events[len(data.Events)-1].NewKey = &nk
		}
	}
	s.render(w, http.StatusOK, "audit", data)
	return nil
}

// auditNames returns how the audit page names the keys and the actors of events: a
// key by its name and masked id, a person by email. The JSON API keeps the ids.
func (s *Server) auditNames(ctx context.Context, orgID string, events []keystore.Event) (func(id string) auditKey, func(actor string) string, error) {
	recs, err := s.keys.List(ctx, orgID)
	if err != nil {
		return nil, nil, err
	}
	names := make(map[string]string, len(recs))
	for _, rec := range recs {
		names[rec.ID] = rec.Name
	}
	var actors []string
	for _, e := range events {
		actors = append(actors, e.Actor)
	}
	emails, err := s.store.UserEmails(ctx, actors)
	if err != nil {
		return nil, nil, err
	}
	keyName := func(id string) auditKey {
		name, ok := names[id]
		if !ok {
			name = "(a key no longer listed)"
		}
		return auditKey{ID: id, Name: name, Masked: s.format.Mask(id)}
	}
	actorName := func(actor string) string {
		switch {
		case actor == keystore.ActorLeakReport:
			return "a leak report"
		case emails[actor] != "":
			return emails[actor]
		}
		return "(a user no longer listed)"
	}
	return keyName, actorName, nil
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
