package caddymodule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"reflect"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
	"go.uber.org/zap/zapcore"

	"github.com/keygate/keygate/internal/testkit/testenv"
	"github.com/keygate/keygate/keystore"
)

// watchedDenier is a Denier that notes when it is asked.
type watchedDenier struct {
	Denier
	asked chan struct{}
}

func (d *watchedDenier) Denied(ctx context.Context, keyID, secret string) (keystore.Key, bool, error) {
	d.asked <- struct{}{}
	return d.Denier.Denied(ctx, keyID, secret)
}

// TestBothRefusalsAfterALookupAreCountedOnlyOnceTheHandlerHasReturned: a key refused
// for its address and an unknown key both get the 401, and ServeHTTP returns, before
// the second look is asked and before anything is counted: the server closes the
// connection, or serves its next request, as soon for either. The access log's
// outcome is the answer's. Once the request is over (its context done), the second
// look counts each as what it was.
func TestBothRefusalsAfterALookupAreCountedOnlyOnceTheHandlerHasReturned(t *testing.T) {
	for _, tc := range []struct {
		name     string
		auth     string
		outcome  keystore.Outcome
		verifier Verifier
		asks     bool
	}{
		{"outside its networks", bearer("RestrictedAdminRestr01"), keystore.OutcomeIPDenied, &fakeVerifier{}, true},
		{"outside its networks, found by a batch partner's address", bearer("RestrictedAdminRestr01"), keystore.OutcomeIPDenied,
			addressBlind{&fakeVerifier{}}, false},
		{"an unknown key", bearer("UnknownUnknownUnknown1"), keystore.OutcomeUnauthenticated, &fakeVerifier{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestHandler(t, tc.verifier, "")
			d := &watchedDenier{Denier: &fakeVerifier{}, asked: make(chan struct{}, 1)}
			h.lookups.denials = d
			ctx, done := context.WithCancel(context.Background())
			defer done()
			extra := new(caddyhttp.ExtraLogFields)
			ctx = context.WithValue(ctx, caddyhttp.ExtraLogFieldsCtxKey, extra)
			r := httptest.NewRequest(http.MethodGet, "http://gw/v1/me", nil).WithContext(ctx)
			r.RemoteAddr = "192.0.2.9:5000"
			r.Header.Set("Authorization", tc.auth)
			w := httptest.NewRecorder()
			if err := h.ServeHTTP(w, r, caddyhttp.HandlerFunc(func(http.ResponseWriter, *http.Request) error { return nil })); err != nil {
				t.Fatal(err)
			}
			if w.Code != http.StatusUnauthorized || w.Body.String() != wantUnauthenticated {
				t.Fatalf("%d %s, want the 401", w.Code, w.Body)
			}
			if got := logged(t, extra); got != `{"outcome":"unauthenticated"}` {
				t.Errorf("access log fields %s, want the answer's outcome alone", got)
			}
			select {
			case <-d.asked:
				t.Fatal("the second look was asked before the request was over")
			default:
			}
			for o := range keystore.NumOutcomes {
				if got := counterValue(t, h.metrics.byOutcome[o]); got != 0 {
					t.Errorf("keygate_requests_total{outcome=%q} = %v before the request was over, want 0", o, got)
				}
			}
			done()
			testenv.Eventually(t, 5*time.Second, fmt.Sprintf("keygate_requests_total{outcome=%q} at 1", tc.outcome), func() bool {
				return counterValue(t, h.metrics.byOutcome[tc.outcome]) == 1
			})
			select {
			case <-d.asked:
				if !tc.asks {
					t.Error("the second look was asked about a key its lookup had found")
				}
			default:
				if tc.asks {
					t.Error("the second look was never asked")
				}
			}
		})
	}
}

// logged returns the access log fields extra holds, as JSON. Caddy keeps them
// unexported: they are read by reflection.
func logged(t *testing.T, extra *caddyhttp.ExtraLogFields) string {
	t.Helper()
	v := reflect.ValueOf(extra).Elem().FieldByName("fields")
	fields := reflect.NewAt(v.Type(), unsafe.Pointer(v.UnsafeAddr())).Elem().Interface().([]zapcore.Field)
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fields {
		f.AddTo(enc)
	}
	b, err := json.Marshal(enc.Fields)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
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
			testenv.Eventually(t, 5*time.Second, fmt.Sprintf("keygate_requests_total{outcome=%q} at 1", tc.outcome), func() bool {
				return counterValue(t, h.metrics.byOutcome[tc.outcome]) == 1
			})
			for _, o := range []keystore.Outcome{keystore.OutcomeIPDenied, keystore.OutcomeUnauthenticated} {
				want := 0.0
				if o == tc.outcome {
					want = 1
				}
				if got := counterValue(t, h.metrics.byOutcome[o]); got != want {
					t.Errorf("keygate_requests_total{outcome=%q} = %v, want %v", o, got, want)
				}
			}
			if got := counted.snapshot(); !slices.Equal(got, tc.rows) {
				t.Errorf("usage record %q, want %q", got, tc.rows)
			}
		})
	}
}
