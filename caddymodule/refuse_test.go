package caddymodule

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"

	"github.com/keygate/keygate/keystore"
)

// flushWatcher is the server's writer under Caddy's wrappers: it notes how many
// requests the metrics had recorded when the answer was flushed.
type flushWatcher struct {
	*httptest.ResponseRecorder
	atFlush  float64
	flushed  bool
	recorded func() float64
}

func (f *flushWatcher) Flush() {
	f.flushed = true
	f.atFlush = f.recorded()
	f.ResponseRecorder.Flush()
}

// TestBothRefusalsAfterALookupAnswerBeforeTheyRecord: a key refused for its address
// and an unknown key both have their 401 flushed to the client, through Caddy's
// writer wrappers, before anything of them is recorded. What a refused restricted
// key records (metrics, access log fields, usage) cannot delay its answer.
func TestBothRefusalsAfterALookupAnswerBeforeTheyRecord(t *testing.T) {
	for _, tc := range []struct {
		name     string
		auth     string
		outcome  keystore.Outcome
		verifier Verifier
	}{
		{"outside its networks", bearer("RestrictedAdminRestr01"), keystore.OutcomeIPDenied, &fakeVerifier{}},
		{"outside its networks, found by a batch partner's address", bearer("RestrictedAdminRestr01"), keystore.OutcomeIPDenied,
			addressBlind{&fakeVerifier{}}},
		{"an unknown key", bearer("UnknownUnknownUnknown1"), keystore.OutcomeUnauthenticated, &fakeVerifier{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestHandler(t, tc.verifier, "")
			counter := h.metrics.byOutcome[tc.outcome]
			fw := &flushWatcher{ResponseRecorder: httptest.NewRecorder(), recorded: func() float64 { return counterValue(t, counter) }}
			w := &caddyhttp.ResponseWriterWrapper{ResponseWriter: fw} // no Flush of its own: Unwrap
			r := httptest.NewRequest(http.MethodGet, "http://gw/v1/me", nil)
			r.RemoteAddr = "192.0.2.9:5000"
			r.Header.Set("Authorization", tc.auth)
			if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
				t.Fatal(err)
			}
			if fw.Code != http.StatusUnauthorized || fw.Body.String() != wantUnauthenticated {
				t.Fatalf("%d %s, want the 401", fw.Code, fw.Body)
			}
			if !fw.flushed {
				t.Fatal("the 401 was never flushed")
			}
			if fw.atFlush != 0 {
				t.Errorf("%v requests recorded when the 401 was flushed, want none yet", fw.atFlush)
			}
			if got := counterValue(t, counter); got != 1 {
				t.Errorf("keygate_requests_total{outcome=%q} = %v after the answer, want 1", tc.outcome, got)
			}
		})
	}
}

// addressBlind is a Verifier that finds a key from any address, as a batch does when
// another request of the key came from inside its networks. ServeHTTP's own check
// then refuses the request.
type addressBlind struct{ *fakeVerifier }

func (v addressBlind) VerifyParsed(ctx context.Context, keyID, secret string, _ netip.Addr) (keystore.Key, bool, error) {
	return v.fakeVerifier.VerifyParsed(ctx, keyID, secret, netip.Addr{})
}

// failingDenier is a Denier whose database cannot answer.
type failingDenier struct{}

func (failingDenier) Denied(context.Context, string, string) (keystore.Key, bool, error) {
	return keystore.Key{}, false, errors.New("postgres down")
}

// TestAKeyItsLookupRefusedIsRecordedAsItsSecondLookSays: the lookup filters out a
// key asked from outside its networks as it does a dead one; the second look, after
// the 401, records it as ip_denied against its key and organisation, in the metrics
// and the usage record, even when the client has gone. Without an answer from the
// second look, the refusal is recorded as an unknown key's, against no one.
func TestAKeyItsLookupRefusedIsRecordedAsItsSecondLookSays(t *testing.T) {
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name    string
		auth    string
		denier  Denier // nil: the fakeVerifier itself
		ctx     context.Context
		outcome keystore.Outcome
		rows    []string
	}{
		{name: "outside its networks", auth: bearer(restricted), outcome: keystore.OutcomeIPDenied,
			rows: []string{"org-1 RestrictedAdminRestr01 ip_denied 401"}},
		{name: "outside its networks, the client gone", auth: bearer(restricted), ctx: gone, outcome: keystore.OutcomeIPDenied,
			rows: []string{"org-1 RestrictedAdminRestr01 ip_denied 401"}},
		{name: "outside its networks, the second look failing", auth: bearer(restricted), denier: failingDenier{},
			outcome: keystore.OutcomeUnauthenticated},
		{name: "an unknown key", auth: bearer("UnknownUnknownUnknown1"), outcome: keystore.OutcomeUnauthenticated},
		{name: "a wrong secret", auth: "Bearer mon_live_RestrictedAdminRestr01.1" + testSecretPart[1:],
			outcome: keystore.OutcomeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := &fakeVerifier{}
			h := newTestHandler(t, v, "")
			if tc.denier != nil {
				h.lookups.denials = tc.denier
			}
			counted := &countedRows{}
			h.usage = counted
			r := httptest.NewRequest(http.MethodGet, "http://gw/v1/monitors", nil)
			if tc.ctx != nil {
				r = r.WithContext(tc.ctx)
			}
			r.RemoteAddr = "192.0.2.9:5000"
			r.Header.Set("Authorization", tc.auth)
			w := httptest.NewRecorder()
			if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(jsonUpstream)); err != nil {
				t.Fatal(err)
			}
			if w.Code != http.StatusUnauthorized || w.Body.String() != wantUnauthenticated {
				t.Fatalf("%d %s, want the 401", w.Code, w.Body)
			}
			if v.calls != 1 {
				t.Errorf("%d lookups, want 1", v.calls)
			}
			for _, o := range []keystore.Outcome{keystore.OutcomeIPDenied, keystore.OutcomeUnauthenticated} {
				want := 0.0
				if o == tc.outcome {
					want = 1
				}
				if got := counterValue(t, h.metrics.byOutcome[o]); got != want {
					t.Errorf("keygate_requests_total{outcome=%q} = %v, want %v", o, got, want)
				}
			}
			if !slices.Equal(counted.rows, tc.rows) {
				t.Errorf("usage record %q, want %q", counted.rows, tc.rows)
			}
		})
	}
}
