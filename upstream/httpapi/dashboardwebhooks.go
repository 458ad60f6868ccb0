package httpapi

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// The dashboard's webhooks page: the org's endpoints, a form to add one, and per
// endpoint its deliveries, a test, a rotation, a change of its URL, description and
// events, enabling or disabling it, and its deletion. Each action calls the
// operations of the JSON routes of webhooks.go.

// deliveriesPageSize is the number of deliveries the endpoint's page shows.
const deliveriesPageSize = 50

// webhookView is an endpoint's row.
type webhookView struct {
	ID, URL, Description, Events, Masked, Created string
	Enabled                                       bool
	// Status says whether it is enabled, and why not.
	Status string
	// Chosen are the event types it takes, none for every type.
	Chosen []string
}

// deliveryView is a delivery's row, its attempts in words.
type deliveryView struct {
	ID, EventID, EventType, State, Created, Next string
	Attempts                                     []string
}

// webhookPage is what the webhooks pages show.
type webhookPage struct {
	List []webhookView
	// Selected is the endpoint whose deliveries are shown, on its page.
	Selected   *webhookView
	Deliveries []deliveryView
	// Secret is a secret just made, shown this once.
	Secret string
	// Form is the creation form as sent, shown again after an error.
	Form struct {
		URL, Description string
		Events           []string
	}
	// Types are the event types an endpoint may choose (WebhookEventTypes).
	Types []string
	// Schemes names the schemes a URL may have: "https", or "http or https".
	Schemes string
}

func toWebhookView(w store.Webhook) webhookView {
	v := webhookView{ID: w.ID, URL: w.URL, Description: w.Description, Masked: maskSecret(w.Secret),
		Created: pageTime(&w.CreatedAt, ""), Enabled: w.Enabled, Events: strings.Join(w.Events, ", "), Status: "enabled",
		Chosen: w.Events}
	if v.Events == "" {
		v.Events = "all"
	}
	switch w.DisabledReason {
	case "failing":
		v.Status = "disabled: every attempt failed for 3 days"
	case "gone":
		v.Status = "disabled: the receiver answered 410 Gone"
	case "user":
		v.Status = "disabled"
	}
	return v
}

// showWebhooks renders the list of p's endpoints with data, as status.
func (s *Server) showWebhooks(ctx context.Context, w http.ResponseWriter, p principal, data *pageData, status int) error {
	list, err := s.store.Webhooks(ctx, p.orgID)
	if err != nil {
		return err
	}
	if data.Webhooks == nil {
		data.Webhooks = &webhookPage{}
	}
	s.webhookForms(data.Webhooks)
	for _, wh := range list {
		data.Webhooks.List = append(data.Webhooks.List, toWebhookView(wh))
	}
	s.render(w, status, "webhooks", data)
	return nil
}

// pageWebhooks answers GET /dashboard/orgs/{orgId}/webhooks.
func (s *Server) pageWebhooks(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.managerPage(r, "Webhooks")
	if err != nil {
		return err
	}
	return s.showWebhooks(r.Context(), w, p, data, http.StatusOK)
}

// webhookForm is managerPage for a form of the webhooks pages. It reads the form.
func (s *Server) webhookForm(w http.ResponseWriter, r *http.Request) (principal, *pageData, url.Values, error) {
	p, data, err := s.managerPage(r, "Webhooks")
	if err != nil {
		return principal{}, nil, nil, err
	}
	form, err := readForm(w, r)
	if err != nil {
		return principal{}, nil, nil, err
	}
	return p, data, form, nil
}

// webhookForms gives page what the forms of the list need.
func (s *Server) webhookForms(page *webhookPage) {
	page.Types, page.Schemes = WebhookEventTypes, "https"
	if s.webhooks.AllowHTTP {
		page.Schemes = "http or https"
	}
}

// webhookInput reads an endpoint's form: url, description and the events checked
// (none: every type), checked as the JSON body is.
func webhookInput(form url.Values) (store.WebhookWrite, error) {
	u, desc := form.Get("url"), form.Get("description")
	in := store.WebhookWrite{URL: &u, Description: &desc}
	if err := checkText("description", desc, 0, maxWebhookDescription); err != nil {
		return in, err
	}
	var err error
	in.Events, err = webhookEvents(form["events"])
	return in, err
}

// pageCreateWebhook adds an endpoint as POST /orgs/{orgId}/webhooks does, for the
// event types checked, and shows its secret once. An error is shown on the list, with
// what was sent.
func (s *Server) pageCreateWebhook(w http.ResponseWriter, r *http.Request) error {
	p, data, form, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	data.Webhooks = &webhookPage{}
	f := &data.Webhooks.Form
	f.URL, f.Description, f.Events = form.Get("url"), form.Get("description"), form["events"]
	in, err := webhookInput(form)
	if err == nil {
		var wh store.Webhook
		if wh, err = s.createWebhook(r.Context(), p, in); err == nil {
			data.Webhooks = &webhookPage{Secret: wh.Secret}
			return s.showWebhooks(r.Context(), w, p, data, http.StatusCreated)
		}
	}
	return s.webhooksError(r.Context(), w, p, data, err)
}

// pageEditWebhook changes the endpoint's URL, description and events as PATCH
// …/webhooks/{id} does. An error is shown on the list.
func (s *Server) pageEditWebhook(w http.ResponseWriter, r *http.Request) error {
	p, data, form, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	in, err := webhookInput(form)
	if err == nil {
		if _, err = s.updateWebhook(r.Context(), p, r.PathValue("id"), in); err == nil {
			seeOther(w, "/dashboard/orgs/"+p.orgID+"/webhooks")
			return nil
		}
	}
	data.Webhooks = &webhookPage{}
	return s.webhooksError(r.Context(), w, p, data, err)
}

// pageDeleteWebhook deletes the endpoint as DELETE …/webhooks/{id} does.
func (s *Server) pageDeleteWebhook(w http.ResponseWriter, r *http.Request) error {
	p, _, _, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	if err := s.store.DeleteWebhook(r.Context(), p.orgID, r.PathValue("id"), p.userID); err != nil {
		return err
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID+"/webhooks")
	return nil
}

// webhooksError shows err on the list, or as the error page when it is the server's.
func (s *Server) webhooksError(ctx context.Context, w http.ResponseWriter, p principal, data *pageData, err error) error {
	switch apperr.Code(err) {
	case apperr.EUNAVAILABLE, apperr.EINTERNAL:
		return err
	}
	list, lerr := s.store.Webhooks(ctx, p.orgID)
	if lerr != nil {
		return lerr
	}
	s.webhookForms(data.Webhooks)
	for _, wh := range list {
		data.Webhooks.List = append(data.Webhooks.List, toWebhookView(wh))
	}
	return showOn("webhooks", data, err)
}

// pageTestWebhook sends a webhook.test event as POST …/webhooks/{id}/test does, then
// shows the endpoint's deliveries.
func (s *Server) pageTestWebhook(w http.ResponseWriter, r *http.Request) error {
	p, _, _, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	if _, err := s.store.TestWebhook(r.Context(), p.orgID, r.PathValue("id"), s.now()); err != nil {
		return err
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID+"/webhooks/"+r.PathValue("id"))
	return nil
}

// pageRotateWebhook rotates the secret as POST …/webhooks/{id}/rotate-secret does and
// shows the new one once.
func (s *Server) pageRotateWebhook(w http.ResponseWriter, r *http.Request) error {
	p, data, _, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	wh, err := s.store.RotateWebhookSecret(r.Context(), p.orgID, r.PathValue("id"), p.userID, webhook.NewSecret(), s.now())
	if err != nil {
		return err
	}
	data.Webhooks = &webhookPage{Secret: wh.Secret}
	return s.showWebhooks(r.Context(), w, p, data, http.StatusOK)
}

// pageEnableWebhook enables or disables the endpoint (form enabled=true|false) as
// PATCH …/webhooks/{id} does.
func (s *Server) pageEnableWebhook(w http.ResponseWriter, r *http.Request) error {
	p, _, form, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	enabled, err := strconv.ParseBool(form.Get("enabled"))
	if err != nil {
		return apperr.Invalid("enabled", "must be true or false")
	}
	if _, err := s.updateWebhook(r.Context(), p, r.PathValue("id"), store.WebhookWrite{Enabled: &enabled}); err != nil {
		return err
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID+"/webhooks")
	return nil
}

// pageWebhookDeliveries answers GET /dashboard/orgs/{orgId}/webhooks/{id}: the
// endpoint and its newest deliveries, as GET …/webhooks/{id}/deliveries reads them.
func (s *Server) pageWebhookDeliveries(w http.ResponseWriter, r *http.Request) error {
	p, data, err := s.managerPage(r, "Webhook deliveries")
	if err != nil {
		return err
	}
	wh, err := s.store.Webhook(r.Context(), p.orgID, r.PathValue("id"))
	if err != nil {
		return err
	}
	list, err := s.store.Deliveries(r.Context(), p.orgID, wh.ID, 0, deliveriesPageSize)
	if err != nil {
		return err
	}
	v := toWebhookView(wh)
	data.Webhooks = &webhookPage{Selected: &v}
	for _, d := range list {
		dv := deliveryView{ID: strconv.FormatInt(d.ID, 10), EventID: d.EventID, EventType: d.EventType, State: d.State,
			Created: pageTime(&d.CreatedAt, ""), Next: pageTime(d.NextAttemptAt, "")}
		for _, a := range d.Attempts {
			what := a.Error
			if what == "" {
				what = strconv.Itoa(a.StatusCode)
			}
			dv.Attempts = append(dv.Attempts, pageTime(&a.At, "")+": "+what+" in "+strconv.FormatInt(a.Duration.Milliseconds(), 10)+" ms")
		}
		data.Webhooks.Deliveries = append(data.Webhooks.Deliveries, dv)
	}
	s.render(w, http.StatusOK, "webhook", data)
	return nil
}

// pageRetryDelivery makes a delivery due now as POST …/deliveries/{deliveryId}/retry
// does, then shows the deliveries again.
func (s *Server) pageRetryDelivery(w http.ResponseWriter, r *http.Request) error {
	p, _, _, err := s.webhookForm(w, r)
	if err != nil {
		return err
	}
	id, err := strconv.ParseInt(r.PathValue("deliveryId"), 10, 64)
	if err != nil || id < 1 {
		return store.ErrDeliveryNotFound
	}
	if err := s.store.RetryDelivery(r.Context(), p.orgID, r.PathValue("id"), id, webhook.MaxAttempts-1, s.now()); err != nil {
		return err
	}
	seeOther(w, "/dashboard/orgs/"+p.orgID+"/webhooks/"+r.PathValue("id"))
	return nil
}
