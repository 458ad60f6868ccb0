package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/upstream/store"
)

// This file holds `upstream key replay-revocations`: after a restore, it ends again
// the keys that were revoked, found leaked or rolled after the backup
// (docs/operations.md, Backups and disaster recovery).

func (c *cli) keyReplayRevocations(name string, args []string) error {
	fs := c.flags(name, "(--from FILE | --from-database URL) [--since TIME] [--dry-run]",
		`Revokes again, in DATABASE_URL restored from a backup, the keys the audit trail says were revoked or found leaked since, and expires again the keys rolled since (at the expiry their roll set, or at the roll without it). The trail comes from the database that was lost or from a copy of it (--from-database: a standby, a point-in-time recovery, the old primary), or from a file (--from: "-" for standard input) of audit events as GET /orgs/{orgId}/audit-events and the dashboard's export give them, one per line or in arrays, or of webhook events. Each event that changes a key joins the audit trail again; a key already revoked, or expiring no later, is left as it is, so running it twice changes nothing. Prints {"events":N,"revoked":[key ids],"expired":[…],"unchanged":[…],"unknown":[…]}: unknown keys were made after the backup and are not in it.`)
	from := fs.String("from", "", "a `file` of audit events, - for standard input")
	fromDB := fs.String("from-database", "", "the postgres:// `URL` of the database the trail is read from")
	sinceText := fs.String("since", "", "replay only events at or after this RFC 3339 `time`: when the backup was taken (default: every event)")
	dryRun := fs.Bool("dry-run", false, "say what it would do, and change nothing")
	if err := c.parse(fs, args); err != nil {
		return err
	}
	if (*from == "") == (*fromDB == "") {
		return usageErrorf("give one of --from and --from-database (see --help)")
	}
	var since time.Time
	if *sinceText != "" {
		t, err := time.Parse(time.RFC3339Nano, *sinceText)
		if err != nil {
			return usageErrorf("--since %q is not an RFC 3339 time such as 2026-11-28T03:00:00Z", *sinceText)
		}
		since = t
	}
	var events []keystore.Event
	var err error
	if *from != "" {
		events, err = c.eventsFromFile(*from, since)
	} else {
		events, err = c.eventsFromDatabase(*fromDB, since)
	}
	if err != nil {
		return err
	}
	pool, err := c.connect(2, store.DefaultDatabaseTimeout, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	rep, err := keystore.New(pool, keystore.Format{}).Replay(c.ctx, events, *dryRun)
	if err != nil {
		return err
	}
	return c.printJSON(struct {
		Events    int      `json:"events"`
		DryRun    bool     `json:"dry_run,omitempty"`
		Revoked   []string `json:"revoked"`
		Expired   []string `json:"expired"`
		Unchanged []string `json:"unchanged"`
		Unknown   []string `json:"unknown"`
	}{len(events), *dryRun, nonNil(rep.Revoked), nonNil(rep.Expired), nonNil(rep.Unchanged), nonNil(rep.Unknown)})
}

// nonNil is list, or an empty list for nil: the output shows [] rather than null.
func nonNil(list []string) []string {
	if list == nil {
		return []string{}
	}
	return list
}

// eventsFromDatabase reads the events that ended a key at or after since from the
// database of url.
func (c *cli) eventsFromDatabase(url string, since time.Time) ([]keystore.Event, error) {
	cfg, err := store.PoolConfig(url, 2, store.DefaultDatabaseTimeout)
	if err != nil {
		return nil, usageErrorf("--from-database is not a valid postgres URL")
	}
	pool, err := store.Open(c.ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("--from-database: %w", err)
	}
	defer pool.Close()
	return keystore.New(pool, keystore.Format{}).Revocations(c.ctx, since)
}

// eventsFromFile reads the events that ended a key at or after since from the file
// path ("-": standard input), oldest first.
func (c *cli) eventsFromFile(path string, since time.Time) ([]keystore.Event, error) {
	r := c.stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, usageErrorf("--from: %v", err)
		}
		defer f.Close()
		r = f
	}
	var events []keystore.Event
	dec := json.NewDecoder(r)
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, usageErrorf("--from: not JSON at byte %d: %v", dec.InputOffset(), err)
		}
		if err := collectEvents(v, since, &events); err != nil {
			return nil, usageErrorf("--from: %v", err)
		}
	}
	// Oldest first: exports and API pages list the newest first.
	sortByTime(events)
	return events, nil
}

// collectEvents appends to events the events in v that ended a key at or after since.
// v is an audit event ({"action","key_id","at",…}), a webhook event ({"type",
// "timestamp","data":{"key_id",…}}), or an array or page ({"data":[…]}) of them.
func collectEvents(v any, since time.Time, events *[]keystore.Event) error {
	switch v := v.(type) {
	case []any:
		for _, x := range v {
			if err := collectEvents(x, since, events); err != nil {
				return err
			}
		}
		return nil
	case map[string]any:
		if list, ok := v["data"].([]any); ok {
			return collectEvents(list, since, events)
		}
		e, err := eventOf(v)
		if err != nil || !keystore.Ends(e.Action) || e.At.Before(since) {
			return err
		}
		*events = append(*events, e)
		return nil
	}
	return fmt.Errorf("%v is neither an event nor a list of them", v)
}

// eventOf reads one audit event or webhook event.
func eventOf(v map[string]any) (keystore.Event, error) {
	str := func(m map[string]any, k string) string { s, _ := m[k].(string); return s }
	e := keystore.Event{Action: str(v, "action"), KeyID: str(v, "key_id"), Actor: str(v, "actor"),
		NewKeyID: str(v, "new_key_id"), URL: str(v, "url")}
	at := str(v, "at")
	if data, ok := v["data"].(map[string]any); ok && e.Action == "" { // a webhook event
		e.Action, at = str(v, "type"), str(v, "timestamp")
		e.KeyID, e.NewKeyID, e.URL = str(data, "key_id"), str(data, "new_key_id"), str(data, "url")
		if exp, err := time.Parse(time.RFC3339Nano, str(data, "expires_at")); err == nil {
			e.ExpiresAt = &exp
		}
	}
	if !keystore.Ends(e.Action) {
		return e, nil
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil || e.KeyID == "" {
		return e, fmt.Errorf("a %s event without a key_id and a time: %v", e.Action, v)
	}
	e.At = t
	return e, nil
}

// sortByTime orders events oldest first, keeping the order of events of one time.
func sortByTime(events []keystore.Event) {
	slices.SortStableFunc(events, func(a, b keystore.Event) int { return a.At.Compare(b.At) })
}
