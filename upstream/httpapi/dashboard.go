package httpapi

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The dashboard is the JSON API's second door, for a person in a browser
// (CONTRACT §14): server-rendered pages under /dashboard whose forms call the same
// code as /auth and /orgs/{orgId}/api-keys (logIn, member, checkAPIAccess, createKey,
// rollKey, revokeKey, the keystore). Its pages stand in the same route table as the
// JSON API (routes), so its state-changing forms pass the same cross-origin
// protection, and the session cookie is the same SameSite=Lax cookie.

//go:embed web
var webFiles embed.FS

// pages holds the dashboard's templates, one per page ("login", "orgs", "keys",
// "revoke", "audit", "error"), each sharing "head" and "foot".
var pages = template.Must(template.New("").ParseFS(webFiles, "web/*.html"))

// staticFiles are the stylesheet and script the pages load, from this origin only.
var staticFiles = func() fs.FS {
	sub, err := fs.Sub(webFiles, "web/static")
	if err != nil {
		panic(err) // the embed pattern above guarantees the directory
	}
	return sub
}()

// dashboardCSP is the Content-Security-Policy of every dashboard answer: nothing from
// another origin, no inline script or style, no eval, no framing, forms only to this
// origin.
const dashboardCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"

// auditPageSize is the number of audit events on one page of the dashboard's trail.
const auditPageSize = 50

// keyRoles are the roles a key may have, in the create form's order.
var keyRoles = []string{string(keystore.RoleAdmin), string(keystore.RoleEditor), string(keystore.RoleViewer)}

// pageData is what every template may show; each page fills what it needs.
type pageData struct {
	Title     string
	Error     string
	User      bool // a user is logged in: the bar shows the navigation and log out
	MultiOrg  bool // the user belongs to several organisations
	Org       *store.OrgMembership
	CanManage bool // the user may manage the org's keys (api_key:manage)

	Email      string // login: the address typed, kept after an error
	Orgs       []store.OrgMembership
	Keys       []keyView
	Key        keyView // revoke: the key to confirm
	NewKey     *newKeyView
	Form       keyForm
	Roles      []string
	Events     []eventView
	NextCursor string
}

// keyView is a key's row: masked, times in words.
type keyView struct {
	ID, Name, Role, Masked              string
	Created, Expires, LastUsed, Revoked string
	Live                                bool
}

// newKeyView is a key just created or rolled: the one page that shows it in full.
type newKeyView struct {
	Name, Key string
	Rolled    bool
}

// keyForm is what the create form was sent with, shown again after an error.
type keyForm struct {
	Name, Role, Expires string
}

// eventView is an audit event's row.
type eventView struct {
	At, Action, KeyID, NewKeyID, URL, Actor string
}

// pageFunc is a dashboard page: it writes its answer (through render or a redirect),
// or returns the error to show, together with what the page shows around the error
// (nil for the error page alone).
type pageFunc func(w http.ResponseWriter, r *http.Request) (tmpl string, data *pageData, err error)

// page adapts a pageFunc to net/http and sets the dashboard's security headers on
// every answer, errors included. An error is shown in words on the page it came with,
// with the status the JSON API would answer (callerError's logging included).
func (s *Server) page(h pageFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		hd := w.Header()
		hd.Set("Content-Security-Policy", dashboardCSP)
		hd.Set("X-Frame-Options", "DENY")
		hd.Set("X-Content-Type-Options", "nosniff")
		hd.Set("Referrer-Policy", "no-referrer")
		hd.Set("Cross-Origin-Opener-Policy", "same-origin")
		hd.Set("Cache-Control", "no-store")
		tmpl, data, err := h(w, r)
		if err == nil {
			return
		}
		e := s.callerError(r, err)
		if e.Code == apperr.ERATELIMITED {
			hd.Set("Retry-After", strconv.Itoa(e.RetryAfter))
		}
		if data == nil {
			tmpl, data = "error", &pageData{Title: "Error"}
		}
		data.Error = pageMessage(e)
		s.render(w, errorResponses[e.Code].status, tmpl, data)
	}
}

// pageMessage says e in words for the person at the page.
func pageMessage(e *apperr.Error) string {
	switch {
	case e == apperr.ErrBadCredentials:
		return "Wrong email or password."
	case e.Code == apperr.ERATELIMITED:
		return fmt.Sprintf("Too many failed logins. Try again in %d seconds.", e.RetryAfter)
	case e.Code == apperr.EFEATUREGATED && e.Detail == "api":
		return "Your organisation's plan has no API access, so it cannot create or roll API keys. Upgrade the plan to use the API."
	case e.Code == apperr.EINVALID:
		return "Please check the form: " + e.Message + "."
	case e.Code == apperr.EFORBIDDEN:
		return "Only Owners and Admins may manage this organisation's API keys."
	case e.Code == apperr.ENOTFOUND:
		return "There is no such page, or it is not yours to see."
	case e.Code == apperr.ECONFLICT:
		return strings.ToUpper(e.Message[:1]) + e.Message[1:] + "."
	case e.Code == apperr.EUNAUTHORIZED:
		return "Please log in."
	case e.Code == apperr.ETOOLARGE:
		return "The form sent was too large."
	case e.Code == apperr.EUNAVAILABLE:
		return "The service is unavailable right now. Please try again shortly."
	}
	return "Something went wrong on our side. Please try again."
}

// render writes the page tmpl with data as status. The page is rendered into a buffer
// first, so a template failure answers 500 rather than half a page.
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

// seeOther redirects the browser to path after a form (303: the next request is a GET).
func seeOther(w http.ResponseWriter, path string) {
	w.Header().Set("Location", path)
	w.WriteHeader(http.StatusSeeOther)
}

// readForm reads a form body (application/x-www-form-urlencoded) within maxBodyBytes.
func readForm(w http.ResponseWriter, r *http.Request) (url.Values, error) {
	body, err := readBody(w, r)
	if err != nil {
		return nil, err
	}
	v, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, apperr.Invalid("form", "could not be read")
	}
	return v, nil
}

// pageHome answers GET /dashboard: the login form without a session; with one, the
// organisation's keys when the user has one organisation, the chooser otherwise (or
// with ?choose=1).
func (s *Server) pageHome(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	userID, err := s.authenticate(r)
	if errors.Is(err, apperr.ErrUnauthenticated) {
		s.render(w, http.StatusOK, "login", &pageData{Title: "Log in"})
		return "", nil, nil
	}
	if err != nil {
		return "", nil, err
	}
	orgs, err := s.store.UserOrgs(r.Context(), userID)
	if err != nil {
		return "", nil, err
	}
	if len(orgs) == 1 && r.URL.Query().Get("choose") == "" {
		seeOther(w, "/dashboard/orgs/"+orgs[0].ID)
		return "", nil, nil
	}
	s.render(w, http.StatusOK, "orgs", &pageData{
		Title: "Organisations", User: true, MultiOrg: len(orgs) > 1, Orgs: orgs,
	})
	return "", nil, nil
}

// pageLogin answers the login form: through logIn, as POST /auth/login, then back to
// /dashboard; a failure shows the form again with the error.
func (s *Server) pageLogin(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	data := &pageData{Title: "Log in"}
	form, err := readForm(w, r)
	if err != nil {
		return "login", data, err
	}
	email, password := form.Get("email"), form.Get("password")
	data.Email = email
	switch {
	case email == "":
		return "login", data, apperr.Invalid("email", "required")
	case password == "":
		return "login", data, apperr.Invalid("password", "required")
	}
	if err := s.logIn(w, r, email, password); err != nil {
		return "login", data, err
	}
	seeOther(w, "/dashboard")
	return "", nil, nil
}

// pageLogout answers the log out button: through logOut, as POST /auth/logout.
func (s *Server) pageLogout(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	if err := s.logOut(w, r); err != nil {
		return "", nil, err
	}
	seeOther(w, "/dashboard")
	return "", nil, nil
}

// orgPage authenticates an organisation's page through member, as the JSON API's
// routes do, and returns what every organisation page shows. Without a session it
// redirects to the login form and returns ok false.
func (s *Server) orgPage(w http.ResponseWriter, r *http.Request, title string) (principal, *pageData, bool, error) {
	p, err := s.member(r)
	if errors.Is(err, apperr.ErrUnauthenticated) {
		seeOther(w, "/dashboard")
		return principal{}, nil, false, nil
	}
	if err != nil {
		return principal{}, nil, false, err
	}
	orgs, err := s.store.UserOrgs(r.Context(), p.userID)
	if err != nil {
		return principal{}, nil, false, err
	}
	data := &pageData{
		Title: title, User: true, MultiOrg: len(orgs) > 1, CanManage: p.canManageKeys(),
		Org: &store.OrgMembership{ID: p.orgID, Role: p.role}, Roles: keyRoles,
		Form: keyForm{Role: string(keystore.RoleViewer)},
	}
	for i := range orgs {
		if orgs[i].ID == p.orgID {
			data.Org = &orgs[i]
		}
	}
	return p, data, true, nil
}

// managerPage is orgPage for the pages and forms of api_key:manage (403 otherwise).
func (s *Server) managerPage(w http.ResponseWriter, r *http.Request, title string) (principal, *pageData, bool, error) {
	p, data, ok, err := s.orgPage(w, r, title)
	if ok && !p.canManageKeys() {
		return p, nil, false, apperr.ErrForbidden
	}
	return p, data, ok, err
}

// managerForm is managerPage for a form sent from the keys page, which it reads.
func (s *Server) managerForm(w http.ResponseWriter, r *http.Request) (principal, *pageData, url.Values, bool, error) {
	p, data, ok, err := s.managerPage(w, r, "API keys")
	if !ok {
		return p, nil, nil, false, err
	}
	form, err := readForm(w, r)
	if err != nil {
		return p, nil, nil, false, err
	}
	return p, data, form, true, nil
}

// pageKeys answers GET /dashboard/orgs/{orgId}: the org's keys, with the controls for
// those who may manage them.
func (s *Server) pageKeys(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	p, data, ok, err := s.orgPage(w, r, "API keys")
	if !ok {
		return "", nil, err
	}
	return s.showKeys(w, r, p, data, http.StatusOK)
}

// showKeys renders the keys page of p's organisation with data as status.
func (s *Server) showKeys(w http.ResponseWriter, r *http.Request, p principal, data *pageData, status int) (string, *pageData, error) {
	recs, err := s.keys.List(r.Context(), p.orgID)
	if err != nil {
		return "", nil, err
	}
	now := s.now()
	for _, rec := range recs {
		data.Keys = append(data.Keys, s.keyView(rec, now))
	}
	s.render(w, status, "keys", data)
	return "", nil, nil
}

// keyView shows rec as of now.
func (s *Server) keyView(rec keystore.Record, now time.Time) keyView {
	return keyView{
		ID: rec.ID, Name: rec.Name, Role: string(rec.Role), Masked: s.format.Mask(rec.ID),
		Created:  pageTime(&rec.CreatedAt, ""),
		Expires:  pageTime(rec.ExpiresAt, "never"),
		LastUsed: pageTime(rec.LastUsedAt, "never"),
		Revoked:  pageTime(rec.RevokedAt, "no"),
		Live:     rec.RevokedAt == nil && (rec.ExpiresAt == nil || rec.ExpiresAt.After(now)),
	}
}

// pageTime shows t to the minute in UTC, or absent when t is nil.
func pageTime(t *time.Time, absent string) string {
	if t == nil {
		return absent
	}
	return t.UTC().Format("2006-01-02 15:04 UTC")
}

// formExpiry is the layout of an <input type="datetime-local">, read as UTC.
const formExpiry = "2006-01-02T15:04"

// pageCreateKey answers the create form: the checks and the code of
// POST /orgs/{orgId}/api-keys (createKey, from the form turned into its JSON body),
// then the keys page showing the full key once. It is never redirected to, so the key
// is in this answer only.
func (s *Server) pageCreateKey(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	p, data, form, ok, err := s.managerForm(w, r)
	if !ok {
		return "", nil, err
	}
	data.Form = keyForm{Name: form.Get("name"), Role: form.Get("role"), Expires: form.Get("expires_at")}
	rec, full, err := s.createFromForm(r, p, data.Form)
	if err != nil {
		return s.keysWithError(w, r, p, data, err)
	}
	data.NewKey = &newKeyView{Name: rec.Name, Key: full}
	data.Form = keyForm{Role: string(keystore.RoleViewer)}
	return s.showKeys(w, r, p, data, http.StatusCreated)
}

// createFromForm creates a key from the create form's fields.
func (s *Server) createFromForm(r *http.Request, p principal, f keyForm) (keystore.Record, string, error) {
	if err := s.checkAPIAccess(r.Context(), p); err != nil {
		return keystore.Record{}, "", err
	}
	body := map[string]any{"name": f.Name, "role": f.Role}
	if f.Expires != "" {
		t, err := time.Parse(formExpiry, f.Expires)
		if err != nil {
			return keystore.Record{}, "", apperr.Invalid("expires_at", "must be a date and time")
		}
		body["expires_at"] = t.UTC().Format(time.RFC3339)
	}
	b, err := json.Marshal(body)
	if err != nil {
		return keystore.Record{}, "", err
	}
	return s.createKey(r.Context(), p, b)
}

// keysWithError shows the keys page with err, with the status the JSON API would
// answer err with; errors of the database are the error page's.
func (s *Server) keysWithError(w http.ResponseWriter, r *http.Request, p principal, data *pageData, err error) (string, *pageData, error) {
	e := s.callerError(r, err)
	if e.Code == apperr.EUNAVAILABLE || e.Code == apperr.EINTERNAL {
		return "", nil, err
	}
	data.Error = pageMessage(e)
	return s.showKeys(w, r, p, data, errorResponses[e.Code].status)
}

// pageConfirmRevoke answers the revoke button: a page asking to confirm.
func (s *Server) pageConfirmRevoke(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	p, data, ok, err := s.managerPage(w, r, "Revoke a key")
	if !ok {
		return "", nil, err
	}
	recs, err := s.keys.List(r.Context(), p.orgID)
	if err != nil {
		return "", nil, err
	}
	id := r.PathValue("id")
	for _, rec := range recs {
		if rec.ID == id {
			data.Key = s.keyView(rec, s.now())
			s.render(w, http.StatusOK, "revoke", data)
			return "", nil, nil
		}
	}
	return "", nil, apperr.ErrNotFound
}

// pageRevoke answers the confirmation: revokeKey, as DELETE /orgs/{orgId}/api-keys/{id},
// then back to the keys.
func (s *Server) pageRevoke(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	p, _, ok, err := s.managerPage(w, r, "API keys")
	if !ok {
		return "", nil, err
	}
	if err := s.revokeKey(r.Context(), p, r.PathValue("id")); err != nil {
		return "", nil, err
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID)
	return "", nil, nil
}

// pageRoll answers a row's roll form: rollKey, as POST /orgs/{orgId}/api-keys/{id}/roll,
// then the keys page showing the new key once.
func (s *Server) pageRoll(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	p, data, form, ok, err := s.managerForm(w, r)
	if !ok {
		return "", nil, err
	}
	rec, full, err := s.rollFromForm(r, p, form.Get("grace_seconds"))
	if err != nil {
		return s.keysWithError(w, r, p, data, err)
	}
	data.NewKey = &newKeyView{Name: rec.Name, Key: full, Rolled: true}
	return s.showKeys(w, r, p, data, http.StatusCreated)
}

// rollFromForm rolls the path's key with the grace typed in the form.
func (s *Server) rollFromForm(r *http.Request, p principal, grace string) (keystore.Record, string, error) {
	if err := s.checkAPIAccess(r.Context(), p); err != nil {
		return keystore.Record{}, "", err
	}
	var body []byte
	if grace != "" {
		n, err := strconv.Atoi(grace)
		if err != nil {
			return keystore.Record{}, "", apperr.Invalid("grace_seconds", "must be a whole number of seconds")
		}
		body = []byte(`{"grace_seconds":` + strconv.Itoa(n) + `}`)
	}
	return s.rollKey(r.Context(), p, r.PathValue("id"), body)
}

// pageAudit answers GET /dashboard/orgs/{orgId}/audit?cursor=: the audit trail, newest
// first, a page at a time.
func (s *Server) pageAudit(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	p, data, ok, err := s.managerPage(w, r, "Audit trail")
	if !ok {
		return "", nil, err
	}
	var before int64
	if v := r.URL.Query().Get("cursor"); v != "" {
		if before, err = decodeEventCursor(v); err != nil {
			return "", nil, err
		}
	}
	events, err := s.keys.Events(r.Context(), p.orgID, before, auditPageSize+1)
	if err != nil {
		return "", nil, err
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
	return "", nil, nil
}

// pageStatic answers GET /dashboard/static/{file}: the embedded stylesheet and script.
func (s *Server) pageStatic(w http.ResponseWriter, r *http.Request) (string, *pageData, error) {
	name := r.PathValue("file")
	if _, err := fs.Stat(staticFiles, name); err != nil {
		return "", nil, apperr.ErrNotFound
	}
	w.Header().Set("Cache-Control", "no-cache")
	http.ServeFileFS(w, r, staticFiles, name)
	return "", nil, nil
}
