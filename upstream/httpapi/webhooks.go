package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/keygate/keygate/upstream/store"
	"github.com/keygate/keygate/upstream/webhook"
)

// The webhook routes (docs/webhooks.md) serve the members who may manage keys, as
// the key routes do. The dashboard's webhooks page calls the same operations.

// webhookJSON is an endpoint as the API shows it. Secret is set only in the answers
// of a creation and a rotation; the others show masked_secret alone.
type webhookJSON struct {
	ID             string   `json:"id"`
	URL            string   `json:"url"`
	Description    string   `json:"description"`
	Events         []string `json:"events"`
	Enabled        bool     `json:"enabled"`
	DisabledReason *string  `json:"disabled_reason"`
	MaskedSecret   string   `json:"masked_secret"`
	Secret         string   `json:"secret,omitempty"`
	CreatedAt      string   `json:"created_at"`
	UpdatedAt      string   `json:"updated_at"`
}

// maskSecret shows the first four characters of a secret's key, enough to tell two
// secrets apart and too few to sign with.
func maskSecret(secret string) string {
	return secret[:len(webhook.SecretPrefix)+4] + "********"
}

func toWebhookJSON(w store.Webhook, withSecret bool) webhookJSON {
	j := webhookJSON{
		ID: w.ID, URL: w.URL, Description: w.Description, Events: w.Events, Enabled: w.Enabled,
		MaskedSecret: maskSecret(w.Secret), CreatedAt: timeJSON(w.CreatedAt), UpdatedAt: timeJSON(w.UpdatedAt),
	}
	if j.Events == nil {
		j.Events = []string{}
	}
	if w.DisabledReason != "" {
		j.DisabledReason = &w.DisabledReason
	}
	if withSecret {
		j.Secret = w.Secret
	}
	return j
}

// handleCreateWebhook answers POST /orgs/{orgId}/webhooks with 201 and the endpoint,
// its secret shown this once.
func (s *Server) handleCreateWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	in, err := decodeWebhook(body, true)
	if err != nil {
		return err
	}
	wh, err := s.createWebhook(r.Context(), p, in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, toWebhookJSON(wh, true))
	return nil
}

// createWebhook checks in's URL and adds the endpoint with a fresh secret, as p.
func (s *Server) createWebhook(ctx context.Context, p principal, in store.WebhookWrite) (store.Webhook, error) {
	if err := s.checkWebhookURL(ctx, in); err != nil {
		return store.Webhook{}, err
	}
	return s.store.CreateWebhook(ctx, p.orgID, p.userID, in, webhook.NewSecret())
}

// handleListWebhooks answers GET /orgs/{orgId}/webhooks with the org's endpoints,
// oldest first, secrets masked.
func (s *Server) handleListWebhooks(w http.ResponseWriter, r *http.Request, p principal) error {
	list, err := s.store.Webhooks(r.Context(), p.orgID)
	if err != nil {
		return err
	}
	data := make([]webhookJSON, 0, len(list))
	for _, wh := range list {
		data = append(data, toWebhookJSON(wh, false))
	}
	writeJSON(w, http.StatusOK, struct {
		Data []webhookJSON `json:"data"`
	}{data})
	return nil
}

// handleGetWebhook answers GET /orgs/{orgId}/webhooks/{id}.
func (s *Server) handleGetWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	wh, err := s.store.Webhook(r.Context(), p.orgID, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(wh, false))
	return nil
}

// handleUpdateWebhook answers PATCH /orgs/{orgId}/webhooks/{id} with 200 and the
// endpoint.
func (s *Server) handleUpdateWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	body, err := readBody(w, r)
	if err != nil {
		return err
	}
	in, err := decodeWebhook(body, false)
	if err != nil {
		return err
	}
	wh, err := s.updateWebhook(r.Context(), p, r.PathValue("id"), in)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(wh, false))
	return nil
}

// updateWebhook checks in's URL, if it sets one, and changes the endpoint id, as p.
func (s *Server) updateWebhook(ctx context.Context, p principal, id string, in store.WebhookWrite) (store.Webhook, error) {
	if err := s.checkWebhookURL(ctx, in); err != nil {
		return store.Webhook{}, err
	}
	return s.store.UpdateWebhook(ctx, p.orgID, id, p.userID, in)
}

// handleDeleteWebhook answers DELETE /orgs/{orgId}/webhooks/{id} with 204.
func (s *Server) handleDeleteWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	if err := s.store.DeleteWebhook(r.Context(), p.orgID, r.PathValue("id"), p.userID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// handleTestWebhook answers POST /orgs/{orgId}/webhooks/{id}/test with 202 and the
// id of the webhook.test event written for the endpoint.
func (s *Server) handleTestWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	id, err := s.store.TestWebhook(r.Context(), p.orgID, r.PathValue("id"), s.now())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, struct {
		EventID string `json:"event_id"`
	}{id})
	return nil
}

// handleRotateWebhookSecret answers POST /orgs/{orgId}/webhooks/{id}/rotate-secret
// with 200 and the endpoint, its new secret shown this once. The old one signs beside
// it for store.SecretOverlap.
func (s *Server) handleRotateWebhookSecret(w http.ResponseWriter, r *http.Request, p principal) error {
	wh, err := s.store.RotateWebhookSecret(r.Context(), p.orgID, r.PathValue("id"), p.userID, webhook.NewSecret(), s.now())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(wh, true))
	return nil
}

// deliveryJSON is a delivery with its attempts, oldest first.
type deliveryJSON struct {
	ID        string `json:"id"`
	EventID   string `json:"event_id"`
	EventType string `json:"event_type"`
	// Event is the body every attempt sent, as stored: valid JSON by construction.
	Event         json.RawMessage `json:"event"`
	State         string          `json:"state"`
	NextAttemptAt *string         `json:"next_attempt_at"`
	CreatedAt     string          `json:"created_at"`
	Attempts      []attemptJSON   `json:"attempts"`
}

// attemptJSON is one attempt: the status it got, or the error that stopped it.
type attemptJSON struct {
	At         string  `json:"at"`
	StatusCode *int    `json:"status_code"`
	Error      *string `json:"error"`
	DurationMS int64   `json:"duration_ms"`
}

func toDeliveryJSON(d store.Delivery) deliveryJSON {
	j := deliveryJSON{
		ID: strconv.FormatInt(d.ID, 10), EventID: d.EventID, EventType: d.EventType, Event: json.RawMessage(d.Body), State: d.State,
		NextAttemptAt: optionalTimeJSON(d.NextAttemptAt), CreatedAt: timeJSON(d.CreatedAt),
		Attempts: make([]attemptJSON, 0, len(d.Attempts)),
	}
	for _, a := range d.Attempts {
		aj := attemptJSON{At: timeJSON(a.At), DurationMS: a.Duration.Milliseconds()}
		if a.Error != "" {
			aj.Error = &a.Error
		} else {
			aj.StatusCode = &a.StatusCode
		}
		j.Attempts = append(j.Attempts, aj)
	}
	return j
}

// handleListDeliveries answers GET /orgs/{orgId}/webhooks/{id}/deliveries?limit=&cursor=
// with 200 {"data":[delivery…],"next_cursor":string or null}, newest first.
func (s *Server) handleListDeliveries(w http.ResponseWriter, r *http.Request, p principal) error {
	limit, before, err := cursorQuery(r)
	if err != nil {
		return err
	}
	list, err := s.store.Deliveries(r.Context(), p.orgID, r.PathValue("id"), before, limit+1)
	if err != nil {
		return err
	}
	writeCursorPage(w, list, limit, func(d store.Delivery) int64 { return d.ID }, toDeliveryJSON)
	return nil
}

// handleRetryDelivery answers POST /orgs/{orgId}/webhooks/{id}/deliveries/{deliveryId}/retry
// with 202: the delivery is due now. A delivered or failed one gets one more attempt.
func (s *Server) handleRetryDelivery(w http.ResponseWriter, r *http.Request, p principal) error {
	id, err := strconv.ParseInt(r.PathValue("deliveryId"), 10, 64)
	if err != nil || id < 1 {
		return store.ErrDeliveryNotFound
	}
	if err := s.store.RetryDelivery(r.Context(), p.orgID, r.PathValue("id"), id, webhook.MaxAttempts-1, s.now()); err != nil {
		return err
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}
