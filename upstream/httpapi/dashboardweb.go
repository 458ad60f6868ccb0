package httpapi

import (
	"bytes"
	"embed"
	"html/template"
	"io/fs"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/internal/version"
	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The dashboard's web files: its templates, the data they show, and its stylesheet,
// script and icon.

//go:embed web
var webFiles embed.FS

// pages holds the dashboard's templates, one per page ("login", "orgs", "keys",
// "revoke", "audit", "usage", "error"). Each page shares "head" and "foot". "foot"
// names the version the upstream runs, through the function version. A page asks
// "has" whether a list holds a value, to check a form's checkboxes.
var pages = template.Must(template.New("").Funcs(template.FuncMap{"version": version.String, "has": slices.Contains[[]string, string],
	"network": network}).ParseFS(webFiles, "web/*.html"))

// network is a network's text (2001:db8::/32) with a chance to break the line after
// each colon: an IPv6 network breaks between its groups rather than anywhere, and an
// IPv4 one not at all.
func network(s string) template.HTML {
	return template.HTML(strings.ReplaceAll(template.HTMLEscapeString(s), ":", ":<wbr>"))
}

// staticFiles are the stylesheet, script and icon the pages load.
var staticFiles = func() fs.FS {
	sub, err := fs.Sub(webFiles, "web/static")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}()

// pageData is what every template may show. Each page fills what it needs.
type pageData struct {
	Title     string
	Error     string
	User      bool // a user is logged in: the bar shows the navigation and log out
	MultiOrg  bool // the user belongs to several organisations
	Org       *store.OrgMembership
	CanManage bool // the user may manage the org's keys (api_key:manage)

	Email    string // login: the address typed, kept after an error
	Orgs     []store.OrgMembership
	Keys     []keyView
	Key      keyView // revoke: the key to confirm
	NewKey   *newKeyView
	Form     keyForm
	Roles    []string
	Scopes   []keystore.Scope // keys: the scopes a key may carry, the vocabulary
	Events   []eventView
	Audit    *auditView // audit: its filter, next page and exports
	Usage    *usageView
	Plan     *planView // keys: the plan's budgets
	Edit     *keyEdit  // keys: a settings form sent back with an error
	Webhooks *webhookPage
}

// planView is what the keys page says of the plan's budgets.
type planView struct {
	PerKey, PerOrg, PerMonth string // PerOrg and PerMonth are empty without that budget
	// PerWindow says each window beside the minute the plan limits ("20 a second").
	PerWindow []string
	// MaxKeyLimit is the highest rate limit a key may have, 0 for no bound.
	MaxKeyLimit int
	// Windows are the fields of a key's limits in its windows beside the minute, in
	// keystore.Window's order.
	Windows []windowField
}

// windowField is the form field of a key's limit in one window beside its minute.
type windowField struct {
	Field, Unit string // keystore.Window's
	Slug        string // the field's name in ids: rate-limit-per-second
	Max         int    // the plan's limit, 0 for no bound
}

// keyEdit is a key's settings form as it was sent, shown again after an error.
type keyEdit struct {
	ID, RateLimit, CIDRs string
	Windows              [keystore.NumWindows]string
	Scopes               []string
}

// keyView is a key's row: masked, times in words.
type keyView struct {
	ID, Name, Role, Masked string
	Created, LastUsed      string
	// State is how the key ends, or ended: "revoked", "expired", "rolled" (a roll
	// replaced it, and it expires at Ends), or "" (it expires at Ends, "never" for no
	// expiry).
	State, Ends string
	Live        bool
	Requests    int64 // in the last 24 hours (keys page)
	// RateLimit is the key's own limit, "" for the plan's; CIDRs its networks, none
	// for anywhere. LimitValue and CIDRsText are the values of its settings form.
	RateLimit  string
	CIDRs      []string
	LimitValue string
	CIDRsText  string
	// WindowLimits say the key's own limits in its windows beside the minute ("2 a
	// second"), none for the plan's; WindowValues are their settings form's values.
	WindowLimits []string
	WindowValues [keystore.NumWindows]string
	// Scopes are the key's scopes, nil for everything its role allows; ScopesChecked
	// are those its settings form checks.
	Scopes        []string
	ScopesChecked []string
	// EditOpen opens the key's settings form: it was sent back with an error.
	EditOpen bool
}

// newKeyView is a key just created or rolled. Its page is the one that shows it in
// full.
type newKeyView struct {
	Name, Key string
	Rolled    bool
}

// keyForm is what the create form was sent with, shown again after an error.
type keyForm struct {
	Name, Role, Expires, RateLimit, CIDRs string
	Windows                               [keystore.NumWindows]string
	Scopes                                []string
}

// eventView is an audit event's row. Actor is the person's email, or what else acted.
// Changes says a key.updated's changes in words. A key.* event has a Key, a
// webhook.* event a Webhook, as the JSON API's key_id and webhook_id.
type eventView struct {
	At, Action, URL, Actor, Changes string
	Key                             *auditKey
	NewKey                          *auditKey // the key a roll created
	Webhook                         *auditWebhook
}

// auditView is the audit page's filter, as chosen, and its links, each keeping it.
type auditView struct {
	Action, KeyID         string // the filter: "" for every action, every key
	Actions               []string
	Keys                  []auditKey // every key the organisation lists, by name
	Next                  string     // the next page's path, "" on the last page
	ExportJSON, ExportCSV string     // the exports' paths
}

// auditKey is a key as the audit page names it.
type auditKey struct {
	ID, Name, Masked string
}

// auditWebhook is a webhook endpoint as the audit page names it. URL is empty once
// the endpoint is deleted.
type auditWebhook struct {
	ID, URL string
}

// render writes the page tmpl with data as status. The page goes to a buffer first,
// so a template failure answers 500 rather than half a page.
func (s *Server) render(w http.ResponseWriter, status int, tmpl string, data *pageData) {
	var buf bytes.Buffer
	if err := pages.ExecuteTemplate(&buf, tmpl, data); err != nil {
		s.logger.Error("rendering dashboard page failed", zap.String("template", tmpl), zap.Error(err))
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(buf.Len()))
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// pageTime shows t to the minute in UTC, or absent when t is nil.
func pageTime(t *time.Time, absent string) string {
	if t == nil {
		return absent
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// pageStatic answers GET /dashboard/static/{file} with an embedded static file.
func (s *Server) pageStatic(w http.ResponseWriter, r *http.Request) error {
	name := r.PathValue("file")
	if _, err := fs.Stat(staticFiles, name); err != nil {
		return apperr.ErrNotFound
	}
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeFileFS(w, r, staticFiles, name)
	return nil
}
