package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// auditPageSize is the number of audit events on one page of the dashboard's trail.
const auditPageSize = 50

// auditExportBatch is how many events the export reads at a time.
const auditExportBatch = 1000

// auditActions are the actions of the audit trail, as the audit page's filter offers
// them.
var auditActions = []string{keystore.ActionCreated, keystore.ActionUpdated, keystore.ActionRolled, keystore.ActionRevoked,
	keystore.ActionLeaked, store.ActionWebhookCreated, store.ActionWebhookUpdated, store.ActionWebhookDeleted,
	store.ActionWebhookRotated, store.ActionWebhookDisabled, store.ActionOrgPlanChanged}

// auditFilter reads the audit page's filter from its query: action, one of
// auditActions, and key, a key id. Either may be empty, for every one.
func auditFilter(q url.Values) (keystore.EventFilter, error) {
	f := keystore.EventFilter{Action: q.Get("action"), KeyID: q.Get("key")}
	if f.Action != "" && !slices.Contains(auditActions, f.Action) {
		return f, apperr.Invalid("action", "is not an action of the audit trail")
	}
	if f.KeyID != "" && !keystore.ValidKeyID(f.KeyID) {
		return f, apperr.Invalid("key", "is not a key id")
	}
	return f, nil
}

// auditQuery is f as the audit page's query, for its links.
func auditQuery(f keystore.EventFilter) url.Values {
	q := url.Values{}
	if f.Action != "" {
		q.Set("action", f.Action)
	}
	if f.KeyID != "" {
		q.Set("key", f.KeyID)
	}
	return q
}

// pageAudit answers GET /dashboard/orgs/{orgId}/audit?action=&key=&cursor= with the
// audit trail, newest first, a page at a time, narrowed to an action or a key. It
// reads the events as GET /orgs/{orgId}/audit-events does.
func (s *Server) pageAudit(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.managerPage(r, "Audit trail")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	f, err := auditFilter(q)
	if err != nil {
		return err
	}
	var before int64
	if v := q.Get("cursor"); v != "" {
		if before, err = decodeEventCursor(v); err != nil {
			return err
		}
	}
	events, err := s.keys.EventsOf(r.Context(), p.orgID, f, before, auditPageSize+1)
	if err != nil {
		return err
	}
	view := &auditView{Action: f.Action, KeyID: f.KeyID, Actions: auditActions}
	query := auditQuery(f)
	if len(events) > auditPageSize {
		events = events[:auditPageSize]
		next := auditQuery(f)
		next.Set("cursor", encodeEventCursor(events[auditPageSize-1].ID))
		view.Next = "/dashboard/orgs/" + p.orgID + "/audit?" + next.Encode()
	}
	query.Set("format", "json")
	export := "/dashboard/orgs/" + p.orgID + "/audit/export?"
	view.ExportJSON = export + query.Encode()
	query.Set("format", "csv")
	view.ExportCSV = export + query.Encode()
	names, err := s.auditNames(r.Context(), p.orgID, events)
	if err != nil {
		return err
	}
	view.Keys = names.all()
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
	data.Audit = view
	s.render(w, http.StatusOK, "audit", data)
	return nil
}

// pageAuditExport answers GET /dashboard/orgs/{orgId}/audit/export?format=&action=&key=
// with every event of the trail the filter keeps, newest first, as a download: JSON, an
// array of the events of GET /orgs/{orgId}/audit-events (what `upstream key
// replay-revocations --from` reads after a restore), or CSV, one event a line.
func (s *Server) pageAuditExport(w http.ResponseWriter, r *http.Request) error {
	p, _, err := s.managerPage(r, "Audit trail")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	f, err := auditFilter(q)
	if err != nil {
		return err
	}
	format := q.Get("format")
	if format != "json" && format != "csv" {
		return apperr.Invalid("format", "must be json or csv")
	}
	var all []eventJSON
	for before := int64(0); ; {
		events, err := s.keys.EventsOf(r.Context(), p.orgID, f, before, auditExportBatch)
		if err != nil {
			return err
		}
		for _, e := range events {
			all = append(all, toEventJSON(e))
		}
		if len(events) < auditExportBatch {
			break
		}
		before = events[len(events)-1].ID
	}
	name := "audit-" + p.orgID + "-" + s.now().UTC().Format("20060102T1504Z") + "." + format
	if format == "json" {
		w.Header().Set("Content-Disposition", `attachment; filename="`+name+`"`)
		writeJSON(w, http.StatusOK, nonNilEvents(all))
		return nil
	}
	writeAuditCSV(w, name, all)
	return nil
}

// nonNilEvents is events, or an empty list for none: the export is [] rather than
// null.
func nonNilEvents(events []eventJSON) []eventJSON {
	if events == nil {
		return []eventJSON{}
	}
	return events
}

// writeAuditCSV answers with events as CSV, to be saved as name. changes is the JSON
// of a key.updated's changes.
func writeAuditCSV(w http.ResponseWriter, name string, events []eventJSON) {
	records := [][]string{{"id", "at", "action", "key_id", "new_key_id", "webhook_id", "actor", "url", "changes"}}
	for _, e := range events {
		changes := ""
		if e.Changes != nil {
			b, _ := json.Marshal(e.Changes)
			changes = string(b)
		}
		records = append(records, []string{e.ID, e.At, e.Action, e.KeyID, e.NewKeyID, e.WebhookID, e.Actor, e.URL, changes})
	}
	writeCSV(w, name, records)
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

// all returns every key the organisation lists, by name, for the audit page's filter.
func (n auditNamer) all() []auditKey {
	keys := make([]auditKey, 0, len(n.keys))
	for id, name := range n.keys {
		keys = append(keys, auditKey{ID: id, Name: name, Masked: n.mask(id)})
	}
	slices.SortFunc(keys, func(a, b auditKey) int { return cmp.Or(strings.Compare(a.Name, b.Name), strings.Compare(a.ID, b.ID)) })
	return keys
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
	case actor == store.ActorOperator:
		return "an operator"
	case actor == keystore.ActorReplay:
		return "a replay after a restore"
	case n.emails[actor] != "":
		return n.emails[actor]
	}
	return "(a user no longer listed)"
}

// changesWords says what a key.updated changed, each setting before and after:
// "rate limit: plan's → 25 a minute; rate limit a second: plan's → 2 a second;
// allowed networks: anywhere → 192.0.2.0/24; scopes: all the role allows →
// monitors:read"; or an org.plan_changed: "plan: free → pro".
func changesWords(c *keystore.Changes) string {
	if c == nil {
		return ""
	}
	var parts []string
	if rl := c.RateLimit; rl != nil {
		parts = append(parts, "rate limit: "+limitWords(rl.From, "a minute")+" → "+limitWords(rl.To, "a minute"))
	}
	for w := range keystore.Window(keystore.NumWindows) {
		if rl := c.Window(w); rl != nil {
			parts = append(parts, "rate limit "+w.Unit()+": "+limitWords(rl.From, w.Unit())+" → "+limitWords(rl.To, w.Unit()))
		}
	}
	if nets := c.AllowedCIDRs; nets != nil {
		parts = append(parts, "allowed networks: "+networksWords(nets.From)+" → "+networksWords(nets.To))
	}
	if sc := c.Scopes; sc != nil {
		parts = append(parts, "scopes: "+scopesWords(sc.From)+" → "+scopesWords(sc.To))
	}
	if p := c.Plan; p != nil {
		parts = append(parts, "plan: "+p.From+" → "+p.To)
	}
	return strings.Join(parts, "; ")
}

// limitWords says a key's own limit n of requests per unit, nil the plan's.
func limitWords(n *int, unit string) string {
	if n == nil {
		return "plan's"
	}
	return strconv.Itoa(*n) + " " + unit
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
