package usageexport

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"time"

	"github.com/keygate/keygate/upstream/store"
)

// The event's fixed attributes.
const (
	// EventType is every event's type.
	EventType = "com.keygate.api.usage"
	// Source is every event's source. A receiver that deduplicates on source and id,
	// as OpenMeter does, sees each event once.
	Source = "keygate"
	// ContentType is the Content-Type of a batch: a JSON array of events in CloudEvents'
	// structured mode.
	ContentType = "application/cloudevents-batch+json"
)

// Event is a CloudEvents 1.0 event in JSON: a key's requests and units in a minute,
// or what a minute gained after its earlier events.
type Event struct {
	SpecVersion     string `json:"specversion"`
	ID              string `json:"id"`
	Source          string `json:"source"`
	Type            string `json:"type"`
	Time            string `json:"time"`
	Subject         string `json:"subject"`
	DataContentType string `json:"datacontenttype"`
	Data            Data   `json:"data"`
}

// Data is an event's data. Requests and Units are the sums over Outcomes.
type Data struct {
	OrgID    string             `json:"org_id"`
	KeyID    string             `json:"key_id"`
	Minute   string             `json:"minute"`
	Requests int64              `json:"requests"`
	Units    int64              `json:"units"`
	Outcomes map[string]Outcome `json:"outcomes"`
}

// Outcome is the part of an event's requests with one outcome, and their units.
type Outcome struct {
	Count int64 `json:"count"`
	Units int64 `json:"units"`
}

// encode returns the event of d with a new id.
func encode(d store.UsageDelta) (store.ExportEvent, error) {
	minute := d.Minute.UTC().Format(time.RFC3339)
	ev := Event{
		SpecVersion: "1.0", ID: newEventID(), Source: Source, Type: EventType, Time: minute,
		Subject: d.OrgID, DataContentType: "application/json",
		Data: Data{OrgID: d.OrgID, KeyID: d.KeyID, Minute: minute, Outcomes: make(map[string]Outcome, len(d.Outcomes))},
	}
	for _, o := range d.Outcomes {
		ev.Data.Requests += o.Count
		ev.Data.Units += o.Units
		ev.Data.Outcomes[o.Outcome] = Outcome{Count: o.Count, Units: o.Units}
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return store.ExportEvent{}, err
	}
	return store.ExportEvent{ID: ev.ID, Minute: d.Minute, Body: body}, nil
}

// newEventID returns "usage_" and 32 random hex digits.
func newEventID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "usage_" + hex.EncodeToString(b[:])
}
