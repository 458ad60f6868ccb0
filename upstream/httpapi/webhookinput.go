package httpapi

import (
	"context"
	"encoding/json"
	"slices"
	"strings"

	"github.com/keygate/keygate/upstream/apperr"
	"github.com/keygate/keygate/upstream/store"
)

// The input of a webhook endpoint's creation and change. The API's JSON body and the
// dashboard's form decode into store.WebhookWrite and share checkWebhook.

// WebhookEventTypes are the event types an endpoint may choose. webhook.test is sent
// to the endpoint tested whatever it chose.
var WebhookEventTypes = []string{
	"key.created", "key.revoked", "key.rolled", "key.leaked", "key.expiring", "key.expired", "quota.threshold",
}

// maxWebhookDescription is the longest description of an endpoint, in characters.
const maxWebhookDescription = 500

// decodeWebhook decodes a creation body {"url","events"?,"description"?} (create) or a
// change's {"url"?,"events"?,"description"?,"enabled"?}. The members are checked in
// body order.
func decodeWebhook(body []byte, create bool) (store.WebhookWrite, error) {
	var required []string
	if create {
		required = []string{"url"}
	}
	w, err := decodeObjectInto(body, "", required, func(w *store.WebhookWrite, name string, raw json.RawMessage) error {
		switch name {
		case "url":
			u, err := decodeString(name, raw)
			w.URL = &u
			return err
		case "description":
			d, err := decodeText(name, raw, 0, maxWebhookDescription)
			w.Description = &d
			return err
		case "events":
			var events []string
			if err := json.Unmarshal(raw, &events); err != nil || string(raw) == "null" {
				return apperr.Invalid(name, "must be an array of event types")
			}
			var err error
			w.Events, err = webhookEvents(events)
			return err
		case "enabled":
			if create {
				break
			}
			b, err := decodeBool(name, raw)
			w.Enabled = &b
			return err
		}
		return apperr.Invalid(name, "unknown field")
	})
	if err == nil && !create && w.URL == nil && w.Description == nil && w.Events == nil && w.Enabled == nil {
		return w, apperr.Invalid("body", "must set url, events, description or enabled")
	}
	return w, err
}

// webhookEvents checks events against WebhookEventTypes and returns them sorted,
// each once. Empty means every type.
func webhookEvents(events []string) ([]string, error) {
	out := make([]string, 0, len(events))
	for _, e := range events {
		if !slices.Contains(WebhookEventTypes, e) {
			return nil, apperr.Invalid("events", "must hold only %s", strings.Join(WebhookEventTypes, ", "))
		}
		out = append(out, e)
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// checkWebhookURL checks w's URL, if it sets one, against the operator's policy,
// resolving its host now.
func (s *Server) checkWebhookURL(ctx context.Context, w store.WebhookWrite) error {
	if w.URL == nil {
		return nil
	}
	if err := s.webhooks.CheckURL(ctx, *w.URL); err != nil {
		return apperr.Invalid("url", "%s", err.Error())
	}
	return nil
}
