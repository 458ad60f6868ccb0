package httpapi

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The dashboard's keys page and its forms: create, roll, revoke and a key's settings.
// Each form runs the checks and the operation of its JSON route (apikeys.go). It
// decodes into the same input type (keyinput.go).

// pageKeys answers GET /dashboard/orgs/{orgId}: the org's keys, with the controls for
// those who may manage them.
func (s *Server) pageKeys(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.orgPage(r, "API keys")
	if err != nil {
		return err
	}
	return s.showKeys(w, r, p, data, http.StatusOK)
}

// showKeys renders the keys page of p's organisation with data, as status.
func (s *Server) showKeys(w http.ResponseWriter, r *http.Request, p principal, data *pageData, status int) error {
	if err := s.listKeys(r.Context(), p, data); err != nil {
		return err
	}
	s.render(w, status, "keys", data)
	return nil
}

// listKeys adds the keys of p's organisation to data, each with its requests in the
// last 24 hours, the plan's budgets and the scopes a key may carry.
func (s *Server) listKeys(ctx context.Context, p principal, data *pageData) error {
	recs, err := s.keys.List(ctx, p.orgID)
	if err != nil {
		return err
	}
	requests, err := s.keyRequests(ctx, p.orgID)
	if err != nil {
		return err
	}
	rolled, err := s.keys.Rolled(ctx, p.orgID)
	if err != nil {
		return err
	}
	budgets, err := s.store.PlanBudgets(ctx, p.orgID)
	if err != nil {
		return err
	}
	data.Plan = newPlanView(budgets)
	if data.Scopes, err = s.keys.Scopes(ctx); err != nil {
		return err
	}
	now := s.now()
	for _, rec := range recs {
		kv := s.keyView(rec, now)
		kv.Requests = requests[rec.ID]
		if kv.Live && rolled[rec.ID] {
			kv.State = "rolled"
		}
		if e := data.Edit; e != nil && e.ID == rec.ID {
			kv.LimitValue, kv.WindowValues, kv.CIDRsText, kv.ScopesChecked, kv.EditOpen = e.RateLimit, e.Windows, e.CIDRs, e.Scopes, true
		}
		data.Keys = append(data.Keys, kv)
	}
	return nil
}

// newPlanView says b in words.
func newPlanView(b store.Budgets) *planView {
	v := &planView{}
	switch {
	case b.APIRateLimit == 0:
		v.PerKey = "no API access"
	case b.APIRateLimit < 0:
		v.PerKey = "unlimited requests a minute per key"
	default:
		v.PerKey = fmt.Sprintf("%d requests a minute per key", b.APIRateLimit)
		v.MaxKeyLimit = b.APIRateLimit
	}
	for w := range keystore.Window(keystore.NumWindows) {
		f := windowField{Field: w.Field(), Unit: w.Unit(), Slug: strings.ReplaceAll(w.Field(), "_", "-")}
		if limit := b.Windows[w]; limit > 0 {
			v.PerWindow = append(v.PerWindow, fmt.Sprintf("%d %s per key", limit, w.Unit()))
			f.Max = limit
		}
		v.Windows = append(v.Windows, f)
	}
	if b.OrgRateLimit > 0 {
		v.PerOrg = fmt.Sprintf("%d a minute for all keys together", b.OrgRateLimit)
	}
	if b.APIRequestsPerMonth > 0 {
		v.PerMonth = fmt.Sprintf("%d a month (UTC)", b.APIRequestsPerMonth)
	}
	return v
}

// keysError returns a form's err to show on the keys page. An error of the server
// itself (503, 500) is shown on the error page instead.
func (s *Server) keysError(ctx context.Context, p principal, data *pageData, err error) error {
	switch apperr.Code(err) {
	case apperr.EUNAVAILABLE, apperr.EINTERNAL:
		return err
	}
	if lerr := s.listKeys(ctx, p, data); lerr != nil {
		return lerr
	}
	return showOn("keys", data, err)
}

// keyView shows rec as of now.
func (s *Server) keyView(rec keystore.Record, now time.Time) keyView {
	kv := keyView{
		ID: rec.ID, Name: rec.Name, Role: string(rec.Role), Masked: s.format.Mask(rec.ID),
		Created:  pageTime(&rec.CreatedAt, ""),
		LastUsed: pageTime(rec.LastUsedAt, "never"),
		Ends:     pageTime(rec.ExpiresAt, "never"),
		Live:     rec.RevokedAt == nil && (rec.ExpiresAt == nil || rec.ExpiresAt.After(now)),
	}
	switch {
	case rec.RevokedAt != nil:
		kv.State, kv.Ends = "revoked", pageTime(rec.RevokedAt, "")
	case !kv.Live:
		kv.State = "expired"
	}
	if rec.RateLimit != nil {
		kv.RateLimit = strconv.Itoa(*rec.RateLimit)
	}
	for w, n := range rec.WindowLimits {
		if n != nil {
			kv.WindowLimits = append(kv.WindowLimits, fmt.Sprintf("%d %s", *n, keystore.Window(w).Unit()))
			kv.WindowValues[w] = strconv.Itoa(*n)
		}
	}
	for _, p := range rec.AllowedCIDRs {
		kv.CIDRs = append(kv.CIDRs, p.String())
	}
	kv.LimitValue, kv.CIDRsText = kv.RateLimit, strings.Join(kv.CIDRs, "\n")
	kv.Scopes, kv.ScopesChecked = rec.Scopes, rec.Scopes
	return kv
}

// pageCreateKey answers the create form as POST /orgs/{orgId}/api-keys does. The keys
// page then shows the full key once. No redirect leads to that page, so the key is in
// this answer only.
func (s *Server) pageCreateKey(w http.ResponseWriter, r *http.Request) error {
	p, data, form, err := s.managerForm(w, r)
	if err != nil {
		return err
	}
	data.Form = keyForm{Name: form.Get("name"), Role: form.Get("role"), Expires: form.Get("expires_at"),
		RateLimit: form.Get(keystore.FieldRateLimit), Windows: formWindows(form), CIDRs: form.Get(keystore.FieldAllowedCIDRs),
		Scopes: form[keystore.FieldScopes]}
	rec, full, err := s.createKeyFromForm(r.Context(), p, form)
	if err != nil {
		return s.keysError(r.Context(), p, data, err)
	}
	data.NewKey = &newKeyView{Name: rec.Name, Key: full}
	data.Form = keyForm{Role: string(keystore.RoleViewer)}
	return s.showKeys(w, r, p, data, http.StatusCreated)
}

// createKeyFromForm checks the plan's API access, reads the form and creates the key.
func (s *Server) createKeyFromForm(ctx context.Context, p principal, form url.Values) (keystore.Record, string, error) {
	if err := s.checkAPIAccess(ctx, p); err != nil {
		return keystore.Record{}, "", err
	}
	in, err := createKeyForm(form, s.now())
	if err != nil {
		return keystore.Record{}, "", err
	}
	return s.createKey(ctx, p, in)
}

// pageRoll answers a row's roll form as POST /orgs/{orgId}/api-keys/{id}/roll does.
// The keys page then shows the new key once.
func (s *Server) pageRoll(w http.ResponseWriter, r *http.Request) error {
	p, data, form, err := s.managerForm(w, r)
	if err != nil {
		return err
	}
	rec, full, err := s.rollKeyFromForm(r.Context(), p, r.PathValue("id"), form)
	if err != nil {
		return s.keysError(r.Context(), p, data, err)
	}
	data.NewKey = &newKeyView{Name: rec.Name, Key: full, Rolled: true}
	return s.showKeys(w, r, p, data, http.StatusCreated)
}

// rollKeyFromForm checks the plan's API access, reads the form and rolls the key keyID.
func (s *Server) rollKeyFromForm(ctx context.Context, p principal, keyID string, form url.Values) (keystore.Record, string, error) {
	if err := s.checkAPIAccess(ctx, p); err != nil {
		return keystore.Record{}, "", err
	}
	in, err := rollKeyForm(form)
	if err != nil {
		return keystore.Record{}, "", err
	}
	return s.rollKey(ctx, p, keyID, in)
}

// pageUpdateKey answers a row's settings form as PATCH /orgs/{orgId}/api-keys/{id}
// does, with both settings: an empty field is the plan's limit, or anywhere. Then it
// goes back to the keys. An error is shown on the keys page, the form open with what
// was typed.
func (s *Server) pageUpdateKey(w http.ResponseWriter, r *http.Request) error {
	p, data, form, err := s.managerForm(w, r)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	if err := s.updateKeyFromForm(r.Context(), p, id, form); err != nil {
		data.Edit = &keyEdit{ID: id, RateLimit: form.Get(keystore.FieldRateLimit), Windows: formWindows(form),
			CIDRs: form.Get(keystore.FieldAllowedCIDRs), Scopes: form[keystore.FieldScopes]}
		return s.keysError(r.Context(), p, data, err)
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID)
	return nil
}

// formWindows returns a form's fields of a key's limits in its windows, as typed.
func formWindows(form url.Values) (v [keystore.NumWindows]string) {
	for w := range keystore.Window(keystore.NumWindows) {
		v[w] = form.Get(w.Field())
	}
	return v
}

// updateKeyFromForm reads a settings form and updates the key keyID.
func (s *Server) updateKeyFromForm(ctx context.Context, p principal, keyID string, form url.Values) error {
	u, err := updateKeyForm(form)
	if err != nil {
		return err
	}
	_, err = s.updateKey(ctx, p, keyID, u)
	return err
}

// pageConfirmRevoke answers a row's revoke button with a page asking to confirm.
func (s *Server) pageConfirmRevoke(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.managerPage(r, "Revoke a key")
	if err != nil {
		return err
	}
	recs, err := s.keys.List(r.Context(), p.orgID)
	if err != nil {
		return err
	}
	id := r.PathValue("id")
	for _, rec := range recs {
		if rec.ID == id {
			data.Key = s.keyView(rec, s.now())
			s.render(w, http.StatusOK, "revoke", data)
			return nil
		}
	}
	return apperr.ErrNotFound
}

// pageRevoke answers the confirmation as DELETE /orgs/{orgId}/api-keys/{id} does, then
// goes back to the keys.
func (s *Server) pageRevoke(w http.ResponseWriter, r *http.Request) error {
	p, _, err := s.managerPage(r, "API keys")
	if err != nil {
		return err
	}
	if err := s.revokeKey(r.Context(), p, r.PathValue("id")); err != nil {
		return err
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID)
	return nil
}
