package gatewayauth_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/keygate/keygate/gatewayauth"
	"github.com/keygate/keygate/gatewayauth/gatewayauthtest"
)

// jwksServer serves a JWKS whose answers serve writes (n is which fetch it answers,
// from 1), and counts its fetches.
func jwksServer(t *testing.T, serve func(n int64, w http.ResponseWriter)) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var fetches atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		serve(fetches.Add(1), w)
	}))
	t.Cleanup(srv.Close)
	return srv, &fetches
}

// jwksVerifier returns a Verifier of a jwksServer, closed when the test ends, after its
// first fetch, and the count of the server's fetches.
func jwksVerifier(t *testing.T, serve func(n int64, w http.ResponseWriter)) (*gatewayauth.Verifier, *atomic.Int64) {
	t.Helper()
	srv, fetches := jwksServer(t, serve)
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(v.Close)
	// The background refresh fetches at once; Refresh waits for a fetch, so that the
	// test starts from a known state (it fails while the server answers with errors).
	v.Refresh(context.Background())
	return v, fetches
}

// publishing answers every fetch with the JWKS of the files published holds.
func publishing(t *testing.T, published *atomic.Value) func(int64, http.ResponseWriter) {
	return func(_ int64, w http.ResponseWriter) {
		b, err := gatewayauth.JWKS(published.Load().([]string)...)
		if err != nil {
			t.Error(err)
		}
		w.Header().Set("Cache-Control", "public, max-age=300")
		w.Write(b)
	}
}

// files returns a holder of published key files for publishing.
func files(f ...string) *atomic.Value {
	var v atomic.Value
	v.Store(f)
	return &v
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

// eventually waits until cond holds, asking every 10ms, and fails t, naming what it
// waited for, if it does not hold within timeout. This module's tests import
// nothing of keygate's, so they have their own.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, timeout)
		}
		time.Sleep(10 * time.Millisecond) // the poll of testenv.Eventually, which this module may not import
	}
}

var testIdentity = gatewayauth.Identity{KeyID: "key1234567890abcdef", OrgID: "0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11", Role: "Editor"}

const wantIdentity = "key1234567890abcdef 0b8e0f0a-5d5e-4c4e-9a57-2f1d9b2c9e11 Editor"

// assertion is a good assertion of testIdentity signed by priv, issued now.
func assertion(t *testing.T, priv ed25519.PrivateKey) []string {
	return []string{gatewayauthtest.Sign(t, priv, gatewayauthtest.KeyID(priv), gatewayauthtest.Good(time.Now(), testIdentity))}
}

func TestMiddlewareAcceptsOnlyAValidAssertion(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	kid := gatewayauthtest.KeyID(priv)
	v, _ := jwksVerifier(t, publishing(t, files(file)))
	now := time.Now()
	signer, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	signed, _ := signer.Assertion(testIdentity.KeyID, testIdentity.OrgID, testIdentity.Role)
	for name, tok := range map[string]string{
		"valid, aud an array":       gatewayauthtest.Sign(t, priv, kid, gatewayauthtest.Good(now, testIdentity)),
		"valid, from a Signer":      signed,
		"expired within the leeway": gatewayauthtest.Sign(t, priv, kid, gatewayauthtest.Good(now.Add(-63*time.Second), testIdentity)),
		"with spaces around it":     " " + signed + " ",
		"issued within the leeway":  gatewayauthtest.Sign(t, priv, kid, gatewayauthtest.Good(now.Add(3*time.Second), testIdentity)),
	} {
		if status, body := through(v, []string{tok}); status != 200 || body != wantIdentity {
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

func TestAKeyPublishedBeforeItSignsIsNeverRefused(t *testing.T) {
	// A rotation done in the right order: the gateway publishes the new key, then
	// signs with it, right after the verifier's last fetch. The first assertion of
	// the new kid makes the verifier fetch the JWKS before it answers.
	_, oldFile := gatewayauthtest.NewKey(t)
	newKey, newFile := gatewayauthtest.NewKey(t)
	published := files(oldFile)
	v, fetches := jwksVerifier(t, publishing(t, published))
	before := fetches.Load()
	published.Store([]string{newFile, oldFile})
	if status, body := through(v, assertion(t, newKey)); status != 200 || body != wantIdentity {
		t.Errorf("the first assertion of the new key: %d %q, want 200", status, body)
	}
	if n := fetches.Load() - before; n != 1 {
		t.Errorf("%d fetches for the new kid, want 1", n)
	}
}

func TestUnknownKidsFetchTheJWKSAtMostOnceASecond(t *testing.T) {
	_, file := gatewayauthtest.NewKey(t)
	v, fetches := jwksVerifier(t, publishing(t, files(file)))
	before := fetches.Load()
	// Twenty assertions of twenty made-up kids at once: one fetch, a second after the
	// last, answers them all.
	var toks [][]string
	for range 20 {
		stranger, _ := gatewayauthtest.NewKey(t)
		toks = append(toks, assertion(t, stranger))
	}
	var wg sync.WaitGroup
	for _, tok := range toks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if status, _ := through(v, tok); status != 401 {
				t.Errorf("an unpublished key's assertion answered %d, want 401", status)
			}
		}()
	}
	wg.Wait()
	if n := fetches.Load() - before; n != 1 {
		t.Errorf("%d fetches for 20 assertions of unknown kids at once, want 1", n)
	}
}

func TestKeysThatCannotBeFetchedAnswer503NotA401(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	var up atomic.Bool
	v, _ := jwksVerifier(t, func(n int64, w http.ResponseWriter) {
		if !up.Load() {
			http.Error(w, "starting", http.StatusInternalServerError)
			return
		}
		publishing(t, files(file))(n, w)
	})
	tok := assertion(t, priv)

	_, err := v.Verify(context.Background(), tok[0])
	if !errors.Is(err, gatewayauth.ErrKeysUnavailable) || errors.Is(err, gatewayauth.ErrUnauthenticated) ||
		!strings.Contains(err.Error(), "500 Internal Server Error") {
		t.Errorf("Verify with the JWKS answering 500: %v, want ErrKeysUnavailable with the cause", err)
	}
	if status, body := through(v, tok); status != 503 || body != `{"error":"service_unavailable"}` {
		t.Errorf("Middleware with the JWKS answering 500: %d %q, want 503 service_unavailable", status, body)
	}
	// An assertion that is bad whatever the keys is still a 401.
	if status, body := through(v, []string{"not.a.jwt"}); status != 401 || body != `{"error":"api key unauthenticated"}` {
		t.Errorf("garbage with the JWKS answering 500: %d %q, want 401", status, body)
	}

	// The JWKS comes back: within a second the same assertion is served.
	up.Store(true)
	if status, _ := through(v, tok); status != 200 {
		t.Errorf("once the JWKS is back: %d, want 200", status)
	}
}

func TestAnUnreachableJWKSIsKeysUnavailableWithItsCause(t *testing.T) {
	priv, _ := gatewayauthtest.NewKey(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close() // nothing listens there any more
	v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: srv.URL + "/.well-known/jwks.json"})
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	_, err = v.Verify(context.Background(), assertion(t, priv)[0])
	var urlErr *url.Error
	if !errors.Is(err, gatewayauth.ErrKeysUnavailable) || !errors.As(err, &urlErr) {
		t.Errorf("Verify with nothing listening at the JWKS URL: %v, want ErrKeysUnavailable wrapping the *url.Error", err)
	}
	if err := v.Refresh(context.Background()); !errors.Is(err, gatewayauth.ErrKeysUnavailable) || !errors.As(err, &urlErr) {
		t.Errorf("Refresh: %v, want ErrKeysUnavailable wrapping the *url.Error", err)
	}
}

func TestARemovedKeyIsRefusedWithinTheJWKSsMaxAge(t *testing.T) {
	// A compromised key is dropped from the JWKS: every verifier stops accepting it
	// within the max-age the JWKS states, with no request needed to notice. (The
	// bounds, a minute..an hour outside tests, are lowered here.)
	gatewayauth.SetMaxAgeBounds(t, 200*time.Millisecond, time.Hour)
	compromised, compromisedFile := gatewayauthtest.NewKey(t)
	current, currentFile := gatewayauthtest.NewKey(t)
	published := files(currentFile, compromisedFile)
	v, _ := jwksVerifier(t, func(_ int64, w http.ResponseWriter) {
		b, _ := gatewayauth.JWKS(published.Load().([]string)...)
		w.Header().Set("Cache-Control", "max-age=0") // the least: 200 ms here
		w.Write(b)
	})
	if status, _ := through(v, assertion(t, compromised)); status != 200 {
		t.Fatalf("the key while published: %d, want 200", status)
	}
	published.Store([]string{currentFile})
	status := 0
	eventually(t, 5*time.Second, "the removed key's assertions refused (the max-age is 200 ms)", func() bool {
		status, _ = through(v, assertion(t, compromised))
		return status == 401
	})
	if status, _ := through(v, assertion(t, current)); status != 200 {
		t.Errorf("the key still published: %d, want 200", status)
	}
}

func TestTheKeysOfTheLastGoodFetchStayWhileTheJWKSFails(t *testing.T) {
	// The gateway is down: its keys are not removed, so they stay in use (an outage
	// of the JWKS is no reason to refuse every request), and a new kid answers 503.
	gatewayauth.SetMaxAgeBounds(t, 100*time.Millisecond, time.Hour)
	priv, file := gatewayauthtest.NewKey(t)
	stranger, _ := gatewayauthtest.NewKey(t)
	var down atomic.Bool
	v, fetches := jwksVerifier(t, func(n int64, w http.ResponseWriter) {
		if down.Load() {
			http.Error(w, "down", http.StatusBadGateway)
			return
		}
		w.Header().Set("Cache-Control", "max-age=0")
		b, _ := gatewayauth.JWKS(file)
		w.Write(b)
	})
	down.Store(true)
	before := fetches.Load()
	eventually(t, 5*time.Second, "a failed background refresh", func() bool { return fetches.Load() != before })
	if status, _ := through(v, assertion(t, priv)); status != 200 {
		t.Errorf("a known key while the JWKS fails: %d, want 200", status)
	}
	if status, _ := through(v, assertion(t, stranger)); status != 503 {
		t.Errorf("an unknown kid while the JWKS fails: %d, want 503", status)
	}
}

func TestMaxAgeIsBoundedToAMinuteAndAnHour(t *testing.T) {
	for _, tc := range []struct {
		cacheControl []string
		want         time.Duration
	}{
		{nil, 5 * time.Minute},
		{[]string{"public, max-age=300"}, 5 * time.Minute},
		{[]string{"max-age=600, public"}, 10 * time.Minute},
		{[]string{`MAX-AGE="120"`}, 2 * time.Minute},
		{[]string{"max-age=5"}, time.Minute},
		{[]string{"max-age=0"}, time.Minute},
		{[]string{"max-age=86400"}, time.Hour},
		{[]string{"max-age=99999999999999999999"}, 5 * time.Minute}, // not a number it can read
		{[]string{"no-store"}, time.Minute},
		{[]string{"max-age=600", "no-cache"}, time.Minute},
		{[]string{"max-age=-1"}, 5 * time.Minute},
	} {
		h := http.Header{"Cache-Control": tc.cacheControl}
		if got := gatewayauth.MaxAge(h); got != tc.want {
			t.Errorf("Cache-Control %q: %s, want %s", tc.cacheControl, got, tc.want)
		}
	}
}

func TestNewRefusesWhatCannotWork(t *testing.T) {
	_, file := gatewayauthtest.NewKey(t)
	for _, tc := range []struct {
		name string
		cfg  gatewayauth.Config
		want string
	}{
		{"neither source", gatewayauth.Config{}, "Config.JWKSURL or Config.KeyFile is required"},
		{"both sources", gatewayauth.Config{JWKSURL: "https://gw/jwks", KeyFile: file}, "are both set"},
		{"a relative URL", gatewayauth.Config{JWKSURL: "/.well-known/jwks.json"}, "not an absolute http or https URL"},
		{"a URL without a scheme", gatewayauth.Config{JWKSURL: "gateway.internal/.well-known/jwks.json"}, "not an absolute http or https URL"},
		{"ftp", gatewayauth.Config{JWKSURL: "ftp://x/jwks"}, "not an absolute http or https URL"},
		{"file", gatewayauth.Config{JWKSURL: "file:///etc/keygate/jwks.json"}, "not an absolute http or https URL"},
		{"no host", gatewayauth.Config{JWKSURL: "https:///jwks"}, "not an absolute http or https URL"},
		{"not a URL", gatewayauth.Config{JWKSURL: "http://gw:port/jwks"}, "Config.JWKSURL"},
		{"a negative leeway", gatewayauth.Config{KeyFile: file, Leeway: -time.Second}, "Config.Leeway -1s is not within 0..5s"},
		{"too long a leeway", gatewayauth.Config{KeyFile: file, Leeway: 6 * time.Second}, "Config.Leeway 6s is not within 0..5s"},
		{"a missing key file", gatewayauth.Config{KeyFile: "/nonexistent.pem"}, "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := gatewayauth.New(tc.cfg)
			if err == nil {
				v.Close()
				t.Fatalf("New accepted %+v", tc.cfg)
			}
			if !strings.HasPrefix(err.Error(), "gatewayauth: ") || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q, want one saying %q", err, tc.want)
			}
		})
	}
	for _, ok := range []string{"http://127.0.0.1:8080/.well-known/jwks.json", "https://gateway.internal/jwks"} {
		v, err := gatewayauth.New(gatewayauth.Config{JWKSURL: ok})
		if err != nil {
			t.Errorf("New refused %s: %v", ok, err)
			continue
		}
		v.Close()
	}
}

func TestErrorHandlerSeesWhyAndShapesTheAnswer(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	var why []error
	v, err := gatewayauth.New(gatewayauth.Config{KeyFile: file, Audience: "billing",
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			why = append(why, err)
			if r.URL.Path == "/v1/monitors" {
				gatewayauth.WriteError(w, err) // the default answer
				return
			}
			http.Error(w, "custom", http.StatusTeapot)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if status, body := through(v, assertion(t, priv)); status != 401 || body != `{"error":"api key unauthenticated"}` {
		t.Errorf("through an ErrorHandler calling WriteError: %d %q", status, body)
	}
	if status, _ := through(v, nil); status != 401 {
		t.Errorf("no assertion: %d", status)
	}
	if len(why) != 2 || !errors.Is(why[0], gatewayauth.ErrUnauthenticated) || !strings.Contains(why[0].Error(), `not "billing"`) ||
		!errors.Is(why[1], gatewayauth.ErrUnauthenticated) || !strings.Contains(why[1].Error(), "no X-Gateway-Identity header") {
		t.Errorf("the ErrorHandler saw %v, want the wrong audience, then the missing header", why)
	}
	h := v.Middleware(http.NotFoundHandler())
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/other", nil))
	if rec.Code != http.StatusTeapot {
		t.Errorf("an ErrorHandler of its own answered %d, want its 418", rec.Code)
	}
}

func TestAFetchOutlivesTheRequestThatBeganIt(t *testing.T) {
	// The request that meets the unknown kid hangs up while the JWKS is on its way: the
	// fetch is everyone's, so it completes, and the next request uses it.
	priv, file := gatewayauthtest.NewKey(t)
	_, otherFile := gatewayauthtest.NewKey(t)
	published := files(otherFile)
	var slow atomic.Bool
	hold := make(chan struct{})
	v, fetches := jwksVerifier(t, func(n int64, w http.ResponseWriter) {
		if slow.Load() {
			<-hold
		}
		publishing(t, published)(n, w)
	})
	published.Store([]string{file})
	slow.Store(true)
	before := fetches.Load()
	tok := assertion(t, priv)[0]
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		eventually(t, 5*time.Second, "the fetch of the unknown kid", func() bool { return fetches.Load() != before })
		cancel()    // hung up while the fetch is on its way
		close(hold) // and only then does the fetch answer
	}()
	v.Verify(ctx, tok)
	if _, err := v.Verify(context.Background(), tok); err != nil || fetches.Load()-before != 1 {
		t.Errorf("the request after the one that hung up: %v after %d fetches, want verified after 1", err, fetches.Load()-before)
	}
}

func TestAKnownKeysAssertionNeverWaitsOnAFetch(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	stranger, _ := gatewayauthtest.NewKey(t)
	release := make(chan struct{})
	var hang atomic.Bool
	v, fetches := jwksVerifier(t, func(n int64, w http.ResponseWriter) {
		if hang.Load() {
			<-release // the fetch for the stranger's kid hangs
		}
		publishing(t, files(file))(n, w)
	})
	defer close(release)
	hang.Store(true)
	before := fetches.Load()
	go through(v, assertion(t, stranger))
	eventually(t, 5*time.Second, "the fetch of the stranger's kid", func() bool { return fetches.Load() != before })
	known := make(chan int)
	go func() {
		status, _ := through(v, assertion(t, priv))
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
	v, _ := jwksVerifier(t, publishing(t, files(newFile, oldFile))) // the new key signs, the old one is still published
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
		k["x"] != base64.RawURLEncoding.EncodeToString(priv.Public().(ed25519.PublicKey)) ||
		k["kid"] != gatewayauth.KeyID(priv.Public().(ed25519.PublicKey)) {
		t.Errorf("key %v", k)
	}
	seed := base64.RawURLEncoding.EncodeToString(priv.Seed())
	if strings.Contains(string(b), seed) {
		t.Error("the JWKS holds the private key's seed")
	}
}

func TestKeyIDIsTheRFC8037Thumbprint(t *testing.T) {
	// RFC 8037 Appendix A.2 and A.3: the public key and its RFC 7638 thumbprint.
	x, _ := base64.RawURLEncoding.DecodeString("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo")
	if got, want := gatewayauth.KeyID(ed25519.PublicKey(x)), "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k"; got != want {
		t.Errorf("KeyID %s, want %s", got, want)
	}
}

func TestAVerifierUsesOnlyTheUsableKeysOfAJWKS(t *testing.T) {
	priv, _ := gatewayauthtest.NewKey(t)
	pub := base64.RawURLEncoding.EncodeToString(priv.Public().(ed25519.PublicKey))
	for _, tc := range []struct {
		name string
		key  string
		ok   bool
	}{
		{"an Ed25519 key", `{"kty":"OKP","crv":"Ed25519","x":"` + pub + `"}`, true},
		{"under a wrong kid", `{"kty":"OKP","crv":"Ed25519","x":"` + pub + `","kid":"other"}`, true},
		{"with a private part", `{"kty":"OKP","crv":"Ed25519","x":"` + pub + `","d":"AAAA"}`, false},
		{"for encryption", `{"kty":"OKP","crv":"Ed25519","x":"` + pub + `","use":"enc"}`, false},
		{"for another algorithm", `{"kty":"OKP","crv":"Ed25519","x":"` + pub + `","alg":"ES256"}`, false},
		{"on another curve", `{"kty":"OKP","crv":"X25519","x":"` + pub + `"}`, false},
		{"with padding", `{"kty":"OKP","crv":"Ed25519","x":"` + pub + `="}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v, _ := jwksVerifier(t, func(_ int64, w http.ResponseWriter) {
				w.Write([]byte(`{"keys":[{"kty":"RSA","n":"AQAB","e":"AQAB"},` + tc.key + `]}`))
			})
			status, _ := through(v, assertion(t, priv))
			if want := map[bool]int{true: 200, false: 401}[tc.ok]; status != want {
				t.Errorf("answered %d, want %d", status, want)
			}
		})
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

func TestASignersAssertionIsWhatTheDocsSay(t *testing.T) {
	priv, _ := gatewayauthtest.NewKey(t)
	s, _ := gatewayauth.NewSigner(priv, "billing")
	tok, _ := s.Assertion("k1", "org", "Admin")
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("%d parts", len(parts))
	}
	var h, c map[string]any
	hb, _ := base64.RawURLEncoding.DecodeString(parts[0])
	cb, _ := base64.RawURLEncoding.DecodeString(parts[1])
	json.Unmarshal(hb, &h)
	json.Unmarshal(cb, &c)
	if len(h) != 3 || h["alg"] != "EdDSA" || h["typ"] != "JWT" || h["kid"] != gatewayauthtest.KeyID(priv) {
		t.Errorf("header %v", h)
	}
	if c["iss"] != "keygate" || c["aud"] != "billing" || c["sub"] != "k1" || c["org_id"] != "org" || c["role"] != "Admin" ||
		c["exp"].(float64)-c["iat"].(float64) != 60 {
		t.Errorf("claims %v", c)
	}
	sig, _ := base64.RawURLEncoding.DecodeString(parts[2])
	if !ed25519.Verify(priv.Public().(ed25519.PublicKey), []byte(parts[0]+"."+parts[1]), sig) {
		t.Error("the signature does not verify with crypto/ed25519")
	}
}

func TestWriteErrorAnswersJSONThatIsNeitherSniffedNorStored(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		status int
		body   string
	}{
		{"a refusal", gatewayauth.ErrUnauthenticated, http.StatusUnauthorized, `{"error":"api key unauthenticated"}`},
		{"keys unavailable", gatewayauth.ErrKeysUnavailable, http.StatusServiceUnavailable, `{"error":"service_unavailable"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			gatewayauth.WriteError(rec, tc.err)
			h := rec.Header()
			if rec.Code != tc.status || rec.Body.String() != tc.body ||
				h.Get("Content-Type") != "application/json" || h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Cache-Control") != "no-store" {
				t.Errorf("WriteError = %d %v %s, want %d, JSON, nosniff, no-store, %s", rec.Code, h, rec.Body, tc.status, tc.body)
			}
		})
	}
}

// TestAScopedKeysAssertionCarriesItsScopes: a Signer writes a scoped key's scopes in
// the scope claim, space-separated, and none for an unscoped key; Verify gives them
// back, and HasScope answers from them.
func TestAScopedKeysAssertionCarriesItsScopes(t *testing.T) {
	priv, file := gatewayauthtest.NewKey(t)
	v, err := gatewayauth.New(gatewayauth.Config{KeyFile: file})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := gatewayauth.NewSigner(priv, gatewayauth.DefaultAudience)
	verify := func(tok string) gatewayauth.Identity {
		t.Helper()
		id, err := v.Verify(context.Background(), tok)
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	scoped, _ := s.Assertion("k1", "org", "Editor", "monitors:read", "monitors:write")
	id := verify(scoped)
	if id.Scope != "monitors:read monitors:write" || !slices.Equal(id.Scopes(), []string{"monitors:read", "monitors:write"}) {
		t.Errorf("scoped identity %+v, scopes %q", id, id.Scopes())
	}
	if !id.HasScope("monitors:write") || id.HasScope("monitors:delete") || id.HasScope("monitors") {
		t.Errorf("HasScope of %q: write %v, delete %v, a prefix %v", id.Scope,
			id.HasScope("monitors:write"), id.HasScope("monitors:delete"), id.HasScope("monitors"))
	}
	if again, _ := s.Assertion("k1", "org", "Editor", "monitors:read"); again == scoped {
		t.Error("changed scopes kept the old assertion")
	}
	unscoped, _ := s.Assertion("k2", "org", "Editor")
	cb, _ := base64.RawURLEncoding.DecodeString(strings.Split(unscoped, ".")[1])
	if strings.Contains(string(cb), `"scope"`) {
		t.Errorf("an unscoped key's claims carry scope: %s", cb)
	}
	id = verify(unscoped)
	if id.Scope != "" || id.Scopes() != nil || !id.HasScope("monitors:delete") {
		t.Errorf("unscoped identity %+v: want no scopes, and HasScope true (its role bounds it)", id)
	}
}
