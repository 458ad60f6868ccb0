package httpapi

import (
	"context"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/store"
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
	names, err := s.auditNames(r.Context(), p.orgID, events)
	if err != nil {
		return err
	}
	for _, e := range events {
		j := toEventJSON(e)
		v := eventView{
			At: pageTime(&e.At, ""), Action: j.Action, URL: j.URL,
			Actor: names.actor(j.Actor), Changes: changesWords(e.Changes),
		}
		if j.KeyID != "" {
			v.Key = names.key(j.KeyID)
		}
		if j.NewKeyID != "" {
			v.NewKey = names.key(j.NewKeyID)
		}
		if j.WebhookID != "" {
			v.Webhook = names.webhook(j.WebhookID)
		}
		data.Events = append(data.Events, v)
	}
	s.render(w, http.StatusOK, "audit", data)
	return nil
}

// auditNamer names what the audit page shows of events, where the JSON API gives ids:
// a key by its name and masked id, a webhook endpoint by its URL, a person by email.
type auditNamer struct {
	mask     func(id string) string
	keys     map[string]string // key id → name
	webhooks map[string]string // endpoint id → URL
	emails   map[string]string // user id → email
}

// auditNames reads the names of the keys, endpoints and people that events name.
// The endpoints are read only when an event is of one.
func (s *Server) auditNames(ctx context.Context, orgID string, events []keystore.Event) (auditNamer, error) {
	n := auditNamer{mask: s.format.Mask, keys: map[string]string{}, webhooks: map[string]string{}}
	recs, err := s.keys.List(ctx, orgID)
	if err != nil {
		return auditNamer{}, err
	}
	for _, rec := range recs {
		n.keys[rec.ID] = rec.Name
	}
	var actors []string
	var webhookEvents bool
	for _, e := range events {
		actors = append(actors, e.Actor)
		webhookEvents = webhookEvents || e.WebhookID != ""
	}
	if webhookEvents {
		list, err := s.store.Webhooks(ctx, orgID)
		if err != nil {
			return auditNamer{}, err
		}
		for _, wh := range list {
			n.webhooks[wh.ID] = wh.URL
		}
	}
	if n.emails, err = s.store.UserEmails(ctx, actors); err != nil {
		return auditNamer{}, err
	}
	return n, nil
}

func (n auditNamer) key(id string) *auditKey {
	name, ok := n.keys[id]
	if !ok {
		name = "(a key no longer listed)"
	}
	return &auditKey{ID: id, Name: name, Masked: n.mask(id)}
}

// webhook names the endpoint id by its URL. A deleted endpoint has none, and the
// page links only to one that is still listed.
func (n auditNamer) webhook(id string) *auditWebhook {
	return &auditWebhook{ID: id, URL: n.webhooks[id]}
}

func (n auditNamer) actor(actor string) string {
	switch {
	case actor == keystore.ActorLeakReport:
		return "a leak report"
	case actor == store.ActorDispatcher:
		return "the webhook dispatcher"
	case actor == keystore.ActorReplay:
		return "a replay after a restore"
	case n.emails[actor] != "":
		return n.emails[actor]
	}
	return "(a user no longer listed)"
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
