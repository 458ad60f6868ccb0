package gatewayauth_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

// jwksVerifier returns a Verifier of a JWKS server whose answers serve writes (n is
// which fetch it answers, from 1), refetched at most once per interval (0: the
// default), and the count of its fetches.
func jwksVerifier(t *testing.T, interval time.Duration, serve func(n int64, w http.ResponseWriter)) (*gatewayauth.Verifier, *atomic.Int64) {
	t.Helper()
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(fetches.Add(1), w)
	}))
	t.Cleanup(srv.Close)
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: srv.URL, RefreshInterval: interval})
	if err != nil {
		t.Fatal(err)
	}
	return v, &fetches
}

// publishing answers every fetch with the JWKS of files.
func publishing(t *testing.T, files ...string) func(int64, http.ResponseWriter) {
	return func(_ int64, w http.ResponseWriter) {
		b, err := gatewayauth.JWKS(files...)
		if err != nil {
			t.Error(err)
		}
		w.Write(b)
	}
}

// through sends a request with headers to Middleware around a handler that answers
// 200 with the identity it found.
func through(v *gatewayauth.Verifier, header []string) (int, string) {
	h := v.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := gatewayauth.FromContext(r.Context())
		w.Write([]byte(id.KeyID + " " + id.OrgID + " " + id.Role))
	}))
	req := httptest.NewRequest("GET", "/v1/monitors", nil)
	for _, v := range header {
		req.Header.Add(gatewayauth.Header, v)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

var testIdentity = gatewayauth.Identity{KeyID: "key1234567890abcdef", OrgID: "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", Role: "Editor"}

func TestMiddlewareAcceptsOnlyAValidAssertion(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	kid := gatewayauthtest.KeyID(priv)
	v, _ := jwksVerifier(t, 0, publishing(t, file))
	const want = "key1234567890abcdef 0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11 Editor"
	now := time.Now()
	for name, c := range map[string]gatewayauthtest.Claims{
		"valid":                     gatewayauthtest.Good(now, testIdentity),
		"expired within the leeway": gatewayauthtest.Good(now.Add(-63*time.Second), testIdentity),
	} {
		if status, body := through(v, []string{gatewayauthtest.Sign(t, priv, kid, c)}); status != 200 || body != want {
			t.Errorf("%s: answered %d %q, want 200 with the identity", name, status, body)
		}
	}
	for _, f := range gatewayauthtest.Forgeries(t, priv, testIdentity) {
		t.Run(f.Name, func(t *testing.T) {
			if status, body := through(v, f.Header); status != 401 || body != `{"error":"api key unauthenticated"}` {
				t.Errorf("answered %d %q, want 401 api key unauthenticated", status, body)
			}
		})
	}
}

func TestAnUnknownKidRefetchesTheJWKSAtMostOncePerInterval(t *testing.T) {
	_, file := gatewayauthtest.NewKey(t)
	newer, newerFile := gatewayauthtest.NewKey(t)
	var published atomic.Value
	published.Store([]string{file})
	v, fetches := jwksVerifier(t, 300*time.Millisecond, func(n int64, w http.ResponseWriter) {
		publishing(t, published.Load().([]string)...)(n, w)
	})
	tok := gatewayauthtest.Sign(t, newer, gatewayauth.KeyID(newer.Public().(ed25519.PublicKey)), gatewayauthtest.Good(time.Now(), testIdentity))
	for range 20 {
		if status, _ := through(v, []string{tok}); status != 401 {
			t.Fatalf("an unpublished key's assertion answered %d", status)
		}
	}
	if n := fetches.Load(); n != 1 {
		t.Errorf("%d fetches for 20 assertions of an unknown kid within the interval, want 1 (the first)", n)
	}
	// The gateway publishes the new key; after the interval the next unknown kid
	// fetches again and finds it.
	published.Store([]string{file, newerFile})
	time.Sleep(350 * time.Millisecond)
	if status, _ := through(v, []string{tok}); status != 200 {
		t.Errorf("after the new key was published: %d, want 200", status)
	}
	if n := fetches.Load(); n != 2 {
		t.Errorf("%d fetches, want 2", n)
	}
}

func TestAJWKSThatCouldNotBeFetchedIsTriedAgainWithinASecond(t *testing.T) {
	// A service started before its gateway: its Refresh at start fails, and holds
	// nothing back; the first assertion's fetch fails too, and the next one comes a
	// second later, not a whole RefreshInterval.
	priv, file := gatewayauthtest.NewKey(t)
	var up atomic.Bool
	v, fetches := jwksVerifier(t, time.Hour, func(n int64, w http.ResponseWriter) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusServiceUnavailable)
			return
		}
		publishing(t, file)(n, w)
	})
	if err := v.Refresh(context.Background()); err == nil {
		t.Fatal("Refresh of a JWKS answering 503 succeeded")
	}
	tok := []string{gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), testIdentity))}
	if status, _ := through(v, tok); status != 401 || fetches.Load() != 2 {
		t.Errorf("at once after the failed Refresh: %d after %d fetches, want 401 after 2", status, fetches.Load())
	}
	up.Store(true)
	if status, _ := through(v, tok); status != 401 || fetches.Load() != 2 {
		t.Errorf("at once after the failed fetch: %d after %d fetches, want 401 after 2", status, fetches.Load())
	}
	time.Sleep(1100 * time.Millisecond)
	if status, _ := through(v, tok); status != 200 || fetches.Load() != 3 {
		t.Errorf("a second after the failed fetch: %d after %d fetches, want 200 after 3", status, fetches.Load())
	}
}

func TestAFetchOutlivesTheRequestThatBeganIt(t *testing.T) {
	// The request that meets the unknown kid hangs up while the JWKS is on its way: the
	// fetch is everyone's, so it completes, and the next request is not held back for
	// a second by a failure that was only the first client's.
	priv, file := gatewayauthtest.NewKey(t)
	v, fetches := jwksVerifier(t, time.Hour, func(n int64, w http.ResponseWriter) {
		time.Sleep(300 * time.Millisecond)
		publishing(t, file)(n, w)
	})
	tok := gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), testIdentity))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	v.Verify(ctx, tok) // hung up after 50 ms; its answer goes nowhere
	if _, err := v.Verify(context.Background(), tok); err != nil || fetches.Load() != 1 {
		t.Errorf("the request after the one that hung up: %v after %d fetches, want verified after 1", err, fetches.Load())
	}
}

func TestAKnownKeysAssertionNeverWaitsOnAFetch(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	stranger, _ := gatewayauthtest.NewKey(t)
	release := make(chan struct{})
	v, fetches := jwksVerifier(t, time.Millisecond, func(n int64, w http.ResponseWriter) {
		if n > 1 {
			<-release // the refetch for the stranger's kid hangs
		}
		publishing(t, file)(n, w)
	})
	defer close(release)
	if err := v.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	go through(v, []string{gatewayauthtest.Sign(t, stranger, gatewayauthtest.KeyID(stranger), gatewayauthtest.Good(time.Now(), testIdentity))})
	for fetches.Load() < 2 {
		time.Sleep(time.Millisecond)
	}
	known := make(chan int)
	go func() {
		status, _ := through(v, []string{gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), testIdentity))})
		known <- status
	}()
	select {
	case status := <-known:
		if status != 200 {
			t.Errorf("a known key's assertion answered %d during a fetch, want 200", status)
		}
	case <-time.After(2 * time.Second):
		t.Error("a known key's assertion waits on the fetch of an unknown kid")
	}
}

func TestRotationKeepsTheOldKeysAssertionsValidUntilTheyExpire(t *testing.T) {
	oldKey, oldFile := gatewayauthtest.NewKey(t)
	newKeyPriv, newFile := gatewayauthtest.NewKey(t)
	v, _ := jwksVerifier(t, 0, publishing(t, newFile, oldFile)) // the new key signs, the old one is still published
	oldSigner, _ := gatewayauth.NewSigner(oldKey, gatewayauth.DefaultAudience)
	newSigner, _ := gatewayauth.NewSigner(newKeyPriv, gatewayauth.DefaultAudience)
	for name, s := range map[string]*gatewayauth.Signer{"old": oldSigner, "new": newSigner} {
		tok, err := s.Assertion("key1234567890abcdef", "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", "Viewer")
		if err != nil {
			t.Fatal(err)
		}
		if status, body := through(v, []string{tok}); status != 200 {
			t.Errorf("the %s key's assertion during the rotation: %d %s", name, status, body)
		}
	}
	// An old assertion past its expiry is refused even while its key is published.
	expired := gatewayauthtest.Sign(t, oldKey, gatewayauthtest.KeyID(oldKey), gatewayauthtest.Good(time.Now().Add(-2*time.Minute), testIdentity))
	if status, _ := through(v, []string{expired}); status != 401 {
		t.Errorf("an expired assertion of the old key answered %d, want 401", status)
	}
}

func TestTheJWKSHasNoPrivatePart(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	b, err := gatewayauth.JWKS(file)
	if err != nil {
		t.Fatal(err)
	}
	var set struct {
		Keys []map[string]any `json:"keys"`
	}
	if err := json.Unmarshal(b, &set); err != nil {
		t.Fatal(err)
	}
	if len(set.Keys) != 1 {
		t.Fatalf("keys %v, want one", set.Keys)
	}
	k := set.Keys[0]
	if _, ok := k["d"]; ok {
		t.Errorf("the JWKS carries the private part d: %s", b)
	}
	if k["kty"] != "OKP" || k["crv"] != "Ed25519" || k["alg"] != "EdDSA" || k["use"] != "sig" ||
		k["kid"] != gatewayauth.KeyID(priv.Public().(ed25519.PublicKey)) {
		t.Errorf("key %v", k)
	}
	seed := base64.RawURLEncoding.EncodeToString(priv.Seed())
	if strings.Contains(string(b), seed) {
		t.Error("the JWKS holds the private key's seed")
	}
}

func TestASignerReusesAnAssertionForHalfItsLifetime(t *testing.T) {
	priv, _ := gatewayauthtest.NewKey(t)
	s, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	a, _ := s.Assertion("k1", "org", "Admin")
	b, _ := s.Assertion("k1", "org", "Admin")
	if a != b {
		t.Error("a second assertion for the same key, org and role was signed anew")
	}
	if c, _ := s.Assertion("k1", "org", "Viewer"); c == a {
		t.Error("a changed role kept the old assertion")
	}
	if d, _ := s.Assertion("k2", "org", "Admin"); d == a {
		t.Error("another key got the same assertion")
	}
}
