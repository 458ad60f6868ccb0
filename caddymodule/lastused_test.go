package caddymodule

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap"

	"github.com/keygate/keygate/keystore"
	"github.com/keygate/keygate/limiter"
)

// idVerifier is a Verifier double that knows key ids, whatever the secret, and counts
// its lookups. The checksum and legacy checks happen before it, or not at all.
type idVerifier struct {
	known map[string]keystore.Key
	calls int
}

func (v *idVerifier) VerifyParsed(_ context.Context, keyID, _ string, _ netip.Addr) (keystore.Key, bool, error) {
	v.calls++
	k, ok := v.known[keyID]
	return k, ok, nil
}

// recorded is a recorder double.
type recorded []string

func (r *recorded) Record(keyID string) { *r = append(*r, keyID) }

func TestKeyFormatDecisions(t *testing.T) {
	f, _ := keystore.NewFormat("mon")
	full, id, _, err := f.Generate()
	if err != nil {
		t.Fatal(err)
	}
	badSum := full[:len(full)-1] + "0"
	if full[len(full)-1] == '0' {
		badSum = full[:len(full)-1] + "1"
	}
	legacyID := "LegacyLegacyLegacy0001"
	legacy := "mon_live_" + legacyID + "." + testSecretPart
	known := map[string]keystore.Key{
		id:       {ID: id, OrgID: "org-1", Role: keystore.RoleEditor, RateLimit: -1},
		legacyID: {ID: legacyID, OrgID: "org-1", Role: keystore.RoleEditor, RateLimit: -1},
	}
	for _, tc := range []struct {
		name       string
		legacyKeys string
		key        string
		status     int
		lookups    int
	}{
		{"checksummed key", "", full, 200, 1},
		{"checksummed key, legacy rejected", "reject", full, 200, 1},
		{"wrong checksum: 401 without a lookup", "", badSum, 401, 0},
		{"wrong checksum, legacy rejected", "reject", badSum, 401, 0},
		{"legacy key accepted", "accept", legacy, 200, 1},
		{"legacy key accepted by default", "", legacy, 200, 1},
		{"legacy key rejected: 401 without a lookup", "reject", legacy, 401, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if badSum == full {
				t.Fatal("the bad checksum is the key")
			}
			v := &idVerifier{known: known}
			h := &Handler{DatabaseURL: "postgres://unused", GatewaySecret: testSecret, LegacyKeys: tc.legacyKeys}
			if err := h.configure(zap.NewNop()); err != nil {
				t.Fatal(err)
			}
			h.metrics = newMetrics()
			withDoubles(h, v, limiter.NewLocal())
			rec := &recorded{}
			h.lastUsed = rec
			r := httptest.NewRequest(http.MethodGet, "http://gw/v1/me", nil)
			r.Header.Set("Authorization", "Bearer "+tc.key)
			w := httptest.NewRecorder()
			next := caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error {
				t.Error("proxied")
				return nil
			})
			if err := h.ServeHTTP(w, r, next); err != nil {
				t.Fatal(err)
			}
			if w.Code != tc.status || v.calls != tc.lookups {
				t.Errorf("status %d after %d lookups, want %d after %d (body %s)", w.Code, v.calls, tc.status, tc.lookups, w.Body)
			}
			if tc.status == 401 {
				if w.Body.String() != wantUnauthenticated || w.Header().Get("WWW-Authenticate") != "Bearer" {
					t.Errorf("401 body %s, WWW-Authenticate %q", w.Body, w.Header().Get("WWW-Authenticate"))
				}
				if len(*rec) != 0 {
					t.Errorf("a refused key was recorded as used: %v", *rec)
				}
				return
			}
			if want := known[strings.Split(strings.TrimPrefix(tc.key, "mon_live_"), ".")[0]].ID; len(*rec) != 1 || (*rec)[0] != want {
				t.Errorf("recorded %v, want [%s]", *rec, want)
			}
		})
	}
}

// lastUsedAt reads a key's last_used_at straight from the database, where the
// gateway writes it.
func (d *db) lastUsedAt(keyID string) *time.Time {
	d.t.Helper()
	var at *time.Time
	if err := d.pool.QueryRow(context.Background(), `SELECT (SELECT last_used_at FROM api_key_last_used WHERE key_id = $1)`, keyID).Scan(&at); err != nil {
		d.t.Fatal(err)
	}
	return at
}

// lastUsedEntries returns the references of the last-used flushers in pools.
func lastUsedEntries() map[string]int {
	out := map[string]int{}
	for key, n := range poolEntries() {
		if strings.HasPrefix(key, "lastused\x00") {
			out[key] = n
		}
	}
	return out
}

// TestLastUsedFlusherSurvivesReloadsAndFlushesWhenRemoved runs with an hour's
// interval, so that only the flush of a flusher being stopped can write.
func TestLastUsedFlusherSurvivesReloadsAndFlushesWhenRemoved(t *testing.T) {
	d, key, id := newDBWithKey(t)
	up := newUpstream(t)
	dbURL := d.ownURL(t)
	gc := gatewayConfig{handler: gatewayOptions(dbURL, map[string]any{"last_used_interval": "1h"}), upstream: up.addr()}
	gw := startGateway(t, gc)
	listen := strings.TrimPrefix(gw.base, "http://")
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	for range 3 {
		gw.reload(t, caddyConfig(listen, gw.logPath, gc))
	}
	want := map[string]int{lastUsedKey(dbURL, time.Hour, true): 1}
	if got := lastUsedEntries(); !reflect.DeepEqual(got, want) {
		t.Errorf("last-used flushers after 3 reloads: %v, want %v", got, want)
	}
	if at := d.lastUsedAt(id); at != nil {
		t.Fatalf("last_used_at %v before any flush (a reload flushed?)", at)
	}

	gw.reload(t, caddyConfig(listen, gw.logPath, gatewayConfig{upstream: up.addr()}))
	if got := lastUsedEntries(); len(got) != 0 {
		t.Errorf("the flusher outlived its last handler: %v", got)
	}
	if at := d.lastUsedAt(id); at == nil || time.Since(*at) > time.Minute {
		t.Errorf("last_used_at %v after the last handler went; want the flush of a stopping flusher", at)
	}
	if sharedPool(dbURL) != nil {
		t.Error("the postgres pool outlived its last handler")
	}
}

func TestLastUsedIntervalOffStartsNoFlusher(t *testing.T) {
	d, key, id := newDBWithKey(t)
	up := newUpstream(t)
	gw := startGateway(t, gatewayConfig{handler: gatewayOptions(d.url, map[string]any{"last_used_interval": -1}), upstream: up.addr()})
	if res, body := gw.get(t, "/v1/me", key); res.StatusCode != http.StatusOK {
		t.Fatalf("%d %s", res.StatusCode, body)
	}
	if got := lastUsedEntries(); len(got) != 0 {
		t.Errorf("last_used_interval off started flushers: %v", got)
	}
	if err := caddy.Stop(); err != nil {
		t.Fatal(err)
	}
	if at := d.lastUsedAt(id); at != nil {
		t.Errorf("last_used_at %v with last_used_interval off", at)
	}
}

func TestInvalidKeyLifecycleOptionsAreRefusedAtLoad(t *testing.T) {
	d := newDB(t)
	up := newUpstream(t)
	for _, tc := range []struct {
		name string
		opts map[string]any
		want string
	}{
		{"legacy_keys unknown", map[string]any{"legacy_keys": "sometimes"}, `legacy_keys "sometimes": must be accept or reject`},
		{"last_used_interval too short", map[string]any{"last_used_interval": "500ms"}, "last_used_interval 500ms: must be at least 1s, or off"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := caddyConfig(freeAddr(t), t.TempDir()+"/caddy.log", gatewayConfig{handler: gatewayOptions(d.url, tc.opts), upstream: up.addr()})
			if err := caddy.Load(cfg, true); err == nil {
				caddy.Stop()
				t.Fatal("the config loaded")
			} else if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
		})
	}
}
