package caddymodule

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
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
		name    string
		auth    string
		outcome outcome
	}{
		{"outside its networks", bearer("RestrictedAdminRestr01"), outcomeIPDenied},
		{"an unknown key", bearer("UnknownUnknownUnknown1"), outcomeUnauthenticated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newTestHandler(t, &fakeVerifier{}, "")
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
